//! The classic Prometheus text format (0.0.4) from OpenMetrics text, for scrapers and tools
//! that read only the former (`promtool check metrics`, older Prometheus). The two differ in
//! three ways for what Cairn exports: a counter's family is named with its `_total` suffix in
//! the classic format, and there are no `# UNIT` lines and no `# EOF`.

/// `openmetrics` (as `prometheus-client` writes it) in the classic text format.
pub fn from_openmetrics(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE, which says whether it is a counter.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), false);
            help = Some(rest);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let counter = rest.ends_with(" counter");
            flush_help(&mut out, help.take(), counter);
            match rest.split_once(' ') {
                Some((name, kind)) if counter => {
                    out.push_str(&format!("# TYPE {name}_total {kind}\n"));
                }
                _ => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            continue;
        }
        flush_help(&mut out, help.take(), false);
        out.push_str(line);
        out.push('\n');
    }
    flush_help(&mut out, help, false);
    out
}

fn flush_help(out: &mut String, help: Option<&str>, counter: bool) {
    let Some(rest) = help else { return };
    match rest.split_once(' ') {
        Some((name, text)) if counter => out.push_str(&format!("# HELP {name}_total {text}\n")),
        _ => {
            out.push_str("# HELP ");
            out.push_str(rest);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_total_name_and_units_and_eof_go() {
        let om = "# HELP x_ops Ops.\n# TYPE x_ops counter\nx_ops_total{a=\"1\"} 3\n\
                  # HELP x_lat Latency.\n# TYPE x_lat_seconds histogram\n# UNIT x_lat_seconds seconds\n\
                  x_lat_seconds_count 1\n# HELP x_used Used.\n# TYPE x_used gauge\nx_used 5\n# EOF\n";
        let text = from_openmetrics(om);
        assert_eq!(
            text,
            "# HELP x_ops_total Ops.\n# TYPE x_ops_total counter\nx_ops_total{a=\"1\"} 3\n\
             # HELP x_lat Latency.\n# TYPE x_lat_seconds histogram\nx_lat_seconds_count 1\n\
             # HELP x_used Used.\n# TYPE x_used gauge\nx_used 5\n"
        );
    }
}
