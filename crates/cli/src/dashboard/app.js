// The Cairn dashboard: polls /api/cluster, keeps the last snapshots to turn the OSDs'
// totals into rates, and draws everything with the DOM (text only: nothing from the cluster
// is ever parsed as HTML) and <canvas>.
"use strict";

const POINTS = 90;
const history = { iops: [], mbps: [], lat: [] };
let prev = null;

const $ = (id) => document.getElementById(id);
const set = (id, v) => { $(id).textContent = String(v); };
const human = (b) => {
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
};
const fixed = (v, d) => (v === null || v === undefined || !isFinite(v)) ? "-" : v.toFixed(d);

function row(tbody, cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  for (const c of cells) {
    const td = document.createElement("td");
    const [text, cls] = Array.isArray(c) ? c : [c, ""];
    td.textContent = String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
  }
  tbody.appendChild(tr);
}

function clear(tableId) {
  const tb = $(tableId).querySelector("tbody");
  tb.replaceChildren();
  return tb;
}

// Per-second rate of a total between the previous snapshot and this one.
function rate(cur, old, key, secs) {
  if (!old || old[key] === undefined || cur[key] === undefined) return null;
  return Math.max(0, cur[key] - old[key]) / secs;
}

function meanMs(cur, old, usKey, nKeys) {
  if (!old) return null;
  const n = nKeys.reduce((s, k) => s + Math.max(0, (cur[k] || 0) - (old[k] || 0)), 0);
  if (n === 0) return null;
  return Math.max(0, (cur[usKey] || 0) - (old[usKey] || 0)) / n / 1000;
}

function draw(id, points, label) {
  const c = $(id);
  const ctx = c.getContext("2d");
  const w = c.width, h = c.height;
  ctx.clearRect(0, 0, w, h);
  const max = Math.max(1e-9, ...points.map((p) => p || 0));
  ctx.strokeStyle = "#e3e6eb";
  ctx.beginPath(); ctx.moveTo(0, h - 1); ctx.lineTo(w, h - 1); ctx.stroke();
  ctx.fillStyle = "#5a6270";
  ctx.font = "11px sans-serif";
  ctx.fillText(label(max), 4, 12);
  ctx.strokeStyle = "#1a73e8";
  ctx.lineWidth = 2;
  ctx.beginPath();
  points.forEach((p, i) => {
    const x = (i / (POINTS - 1)) * w;
    const y = h - 2 - ((p || 0) / max) * (h - 16);
    if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
  });
  ctx.stroke();
}

function push(series, v) {
  series.push(v);
  while (series.length > POINTS) series.shift();
}

function render(d) {
  const s = d.status || {};
  if (s.error) {
    set("health", "unknown");
    $("health").className = "badge HEALTH_ERR";
    clear("osds");
    const ul = $("problems"); ul.replaceChildren();
    const li = document.createElement("li"); li.textContent = "status: " + s.error; ul.appendChild(li);
  } else {
    set("health", s.health);
    $("health").className = "badge " + s.health;
    set("epoch", s.epoch);
    const ul = $("problems");
    ul.replaceChildren();
    for (const p of s.problems || []) {
      const li = document.createElement("li"); li.textContent = p; ul.appendChild(li);
    }
    if (!(s.problems || []).length) {
      const li = document.createElement("li"); li.textContent = "no problems"; ul.appendChild(li);
    }
    set("osds-total", s.osds.total); set("osds-up", s.osds.up); set("osds-in", s.osds.in);
    const m = s.mons || {};
    set("mons", m.members !== undefined ? `${m.members} (leader mon.${m.leader}, term ${m.term})` : "-");
    set("capacity", `${human(s.capacity.used_bytes)} used of ${human(s.capacity.total_bytes)}`);
    set("pgs-total", s.pgs.total); set("pgs-clean", s.pgs.active_clean);
    set("pgs-degraded", s.pgs.active_degraded); set("pgs-inactive", s.pgs.inactive);
    set("pgs-peering", s.pgs.peering); set("pgs-down", s.pgs.down);
    const r = s.recovery;
    set("recovery", `${r.objects_degraded} objects degraded, ${r.objects_recovered} recovered, ` +
      `${fixed(r.bytes_per_sec / 1e6, 1)} MB/s` +
      (r.seconds_left ? `, about ${r.seconds_left} s left` : ""));
    set("scrub", `${s.scrub.repaired} copies repaired, ${s.scrub.unrepaired} unrepaired`);
  }
  const secs = prev ? Math.max(0.001, (d.at_ms - prev.at_ms) / 1000) : 1;
  const old = (list, id) => prev && Array.isArray(list) ? list.find((x) => x.id === id) : null;

  // OSDs
  const tb = clear("osds");
  let totOps = 0, totBytes = 0, totLatUs = 0, totN = 0, have = false;
  if (Array.isArray(d.osds)) {
    for (const o of d.osds) {
      const p = old(prev && prev.osds, o.id);
      const ops = rate(o, p, "ops", secs);
      const state = `${o.up ? "up" : "down"}, ${o.in ? "in" : "out"}`;
      const used = o.capacity_bytes ? `${fixed(100 * o.used_bytes / o.capacity_bytes, 1)}%` : "-";
      row(tb, [`osd.${o.id}`, o.host, [state, o.up ? (o.in ? "up" : "out") : "down"], [used, "num"],
        [o.pgs_held ?? "-", "num"], [fixed(ops, 0), "num"],
        [fixed(meanMs(o, p, "op_latency_us", ["ops"]), 3), "num"],
        [fixed(meanMs(o, p, "commit_latency_us", ["commits"]), 3), "num"]],
        { "data-osd": o.id, "data-state": o.up ? "up" : "down" });
    }
  }
  // Hosts: the OSDs by host (a failure domain)
  const hb = clear("hosts");
  if (Array.isArray(d.osds)) {
    const hosts = new Map();
    for (const o of d.osds) {
      const h = hosts.get(o.host) || { osds: 0, up: 0, in: 0, used: 0, cap: 0 };
      h.osds += 1; h.up += o.up ? 1 : 0; h.in += o.in ? 1 : 0;
      h.used += o.used_bytes || 0; h.cap += o.capacity_bytes || 0;
      hosts.set(o.host, h);
    }
    for (const [name, h] of [...hosts].sort((a, b) => a[0].localeCompare(b[0]))) {
      const used = h.cap ? `${fixed(100 * h.used / h.cap, 1)}%` : "-";
      row(hb, [name, [h.osds, "num"], [h.up, h.up < h.osds ? "num down" : "num"], [h.in, "num"],
        [used, "num"], [h.cap ? human(h.cap) : "-", "num"]], { "data-host": name, "data-up": h.up });
    }
  }
  // Pools (cluster rates come from them: each op counted once, by its primary)
  const pb = clear("pools");
  if (Array.isArray(d.pools)) {
    for (const p of d.pools) {
      const q = old(prev && prev.pools, p.id);
      const r = rate(p, q, "reads", secs), w = rate(p, q, "writes", secs);
      const bi = rate(p, q, "bytes_in", secs), bo = rate(p, q, "bytes_out", secs);
      if (q) {
        have = true;
        totOps += (r || 0) + (w || 0);
        totBytes += (bi || 0) + (bo || 0);
        totLatUs += Math.max(0, p.read_latency_us - q.read_latency_us) +
          Math.max(0, p.write_latency_us - q.write_latency_us);
        totN += Math.max(0, p.reads - q.reads) + Math.max(0, p.writes - q.writes);
      }
      const layout = p.shards ? p.kind : `${p.kind}, size ${p.size}`;
      row(pb, [p.name, layout, p.shards || "-", [p.pg_count, "num"], [fixed(r, 0), "num"],
        [fixed(w, 0), "num"], [fixed(bi === null ? null : (bi + bo) / 1e6, 1), "num"],
        [fixed(meanMs(p, q, "write_latency_us", ["writes"]), 3), "num"]],
        { "data-pool": p.name });
    }
  }
  // Volumes
  const vb = clear("volumes");
  if (Array.isArray(d.volumes)) {
    for (const v of d.volumes) {
      if (v.error) { row(vb, [`${v.pool}: ${v.error}`]); continue; }
      const alloc = v.allocated_bytes === null || v.allocated_bytes === undefined
        ? "-" : human(v.allocated_bytes);
      row(vb, [`${v.pool}/${v.name}`, [human(v.size_bytes), "num"], [alloc, "num"], [v.holders, "num"],
        [v.read_ops, "num"], [v.write_ops, "num"],
        [fixed((v.read_bytes + v.write_bytes) / 1e6, 1), "num"]], { "data-volume": v.name });
    }
  }
  if (have) {
    push(history.iops, totOps);
    push(history.mbps, totBytes / 1e6);
    push(history.lat, totN ? totLatUs / totN / 1000 : 0);
    set("now-iops", `${fixed(totOps, 0)} ops/s now`);
    set("now-mbps", `${fixed(totBytes / 1e6, 1)} MB/s now`);
    set("now-lat", totN ? `${fixed(totLatUs / totN / 1000, 3)} ms now` : "no ops");
  }
  draw("chart-iops", history.iops, (m) => `${fixed(m, 0)} ops/s`);
  draw("chart-mbps", history.mbps, (m) => `${fixed(m, 1)} MB/s`);
  draw("chart-lat", history.lat, (m) => `${fixed(m, 3)} ms`);
  set("updated", "updated " + new Date(d.at_ms).toLocaleTimeString());
  prev = d;
}

async function poll() {
  try {
    const r = await fetch("/api/cluster", { cache: "no-store", credentials: "same-origin" });
    if (r.status === 401) { window.location = "/login"; return; }
    const d = await r.json();
    if (!d.loading && d.at_ms !== (prev && prev.at_ms)) render(d);
  } catch (e) {
    set("updated", "cannot reach the dashboard: " + e);
  }
}

poll();
setInterval(poll, 1000);
