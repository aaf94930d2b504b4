"""``fray dashboard``: a read-only web page over the job store and cluster the CLI uses.

Pages (plain HTML, one script, one style sheet; no build step): ``/`` the jobs (status, name, age, attempts,
pending reason, goodput) with filters and live refresh; ``/job/ID`` a job: its attempts drawn as a timeline
(one row per slice, SVG), per-host log tails, the request; ``/fleet`` a simulated fleet's slices, who holds
them and which are quarantined. A JSON API under ``/api/``: ``/api/jobs`` (the fields of ``fray list --json``,
filters ``status`` and ``name``), ``/api/jobs/ID`` (``fray status ID --json``), ``/api/jobs/ID/logs`` (the last
lines of each host), ``/api/fleet``.

Built on aiohttp (the ``dashboard`` extra), imported only by ``fray dashboard`` and :func:`make_app`: never by
``import fray_core``. Read-only (GET only), bound to 127.0.0.1 by default, and it answers only requests whose
``Host`` is the address it serves (a page elsewhere cannot reach it through DNS rebinding). Job bytes (names,
errors, log lines) are put in the page as text by the script (``textContent``), never as markup.

>>> from fray_local import LocalCluster
>>> app = make_app(LocalCluster())  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web

    from fray_core.cluster import Cluster

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "fleet_json", "make_app", "serve"]

#: ``fray dashboard``'s default port (Ray's dashboard is 8265)
DEFAULT_PORT = 8290
DEFAULT_HOST = "127.0.0.1"
LOG_TAIL = 50  # lines per host on a job's page
_TAG = re.compile(r"^(\[a\d+ (?:s\d+/h\d+|r\d+)\])")


def _filter(infos: list[Any], status: str | None, name: str | None) -> list[Any]:
    if status:
        wanted = {s.strip().upper() for s in status.split(",") if s.strip()}
        infos = [i for i in infos if i.status.value.upper() in wanted]
    if name:
        infos = [i for i in infos if fnmatch.fnmatchcase(i.name, name)]
    return sorted(infos, key=lambda i: i.submitted_at)


def log_tails(cluster: Cluster, job_id: str, per_host: int = LOG_TAIL) -> dict[str, list[str]]:
    """The last ``per_host`` lines of each host of each attempt (by tag, ``[a0 s1/h0]``), the latest attempt
    first, read from the end of the log (its last ``64 * per_host`` lines: a host quiet for that long is not
    shown)."""
    from fray_core.records import JobStore, stream_log

    store = getattr(cluster, "store", None)
    lines = stream_log(store, job_id, tail=per_host * 64) if isinstance(store, JobStore) else cluster.logs(job_id)
    hosts: dict[str, list[str]] = {}
    for line in lines:
        m = _TAG.match(line)
        tag = m.group(1) if m else "[fray]"
        kept = hosts.setdefault(tag, [])
        kept.append(line[len(tag) :].lstrip() if m else line)
        if len(kept) > per_host:
            del kept[0]
    # the latest attempt's hosts first (a page of 8 attempts opened on attempt 0), then by slice and host
    return dict(sorted(hosts.items(), key=lambda kv: _tag_order(kv[0])))


def _tag_order(tag: str) -> tuple[int, list[int]]:
    numbers = [int(n) for n in re.findall(r"\d+", tag)]
    return (-numbers[0], numbers[1:]) if numbers else (1, [])  # "[fray]" lines last


def fleet_json(cluster: Cluster, infos: list[Any]) -> dict[str, Any] | None:
    """The cluster's simulated fleet: every slice, its state, who holds it (the fleet's lease, else a job
    whose running attempt holds it, from the records) and its quarantine; ``None`` without a fleet."""
    from fray_core.fleet import simulated_fleet

    fleet = simulated_fleet(cluster)
    if fleet is None:
        return None
    holders: dict[str, str] = {}
    for info in infos:
        att = info.current_attempt
        if att is not None and att.outcome is None and not info.status.is_terminal():
            for name in att.slices:
                holders[name] = str(info.job_id)
    slices = []
    for sl in fleet.slices():
        quarantined = sl.quarantined_until is not None
        holder = sl.holder or holders.get(sl.name)
        # a fleet built from a spec here is this process's model: a job launched by another process holds its
        # slice in that process's fleet, and only its record says so (free here, busy there)
        state = "busy" if holder and sl.state == "free" else sl.state
        slices.append(
            {
                "name": sl.name,
                "type": sl.tpu_type,
                "hosts": sl.hosts,
                "state": state,
                "holder": holder,
                "preemptions": sl.preemptions,
                "quarantined": quarantined,
                "quarantine_note": sl.quarantine_note if quarantined else None,
            }
        )
    return {"on_demand": bool(fleet.on_demand), "capacity": fleet.capacity(), "slices": slices}


def make_app(cluster: Cluster, allowed_hosts: set[str] | None = None, refresh: float = 2.0) -> web.Application:
    """The dashboard as an aiohttp application over ``cluster`` (its job store and, when it has one, its fleet).
    ``allowed_hosts``: the ``Host`` header values to answer (``None``: any, for tests with their own client)."""
    from aiohttp import web

    from fray_core.cli.output import job_json
    from fray_core.errors import JobNotFoundError, RecordError

    async def blocking(fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)  # the store is files: keep the event loop free

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if allowed_hosts is not None and request.host not in allowed_hosts:
            return web.Response(status=421, text="misdirected request: this dashboard answers only its own address\n")
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="read-only\n")
        response = await handler(request)
        response.headers["Content-Security-Policy"] = (
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
            "frame-ancestors 'none'"
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    def page(title: str, kind: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(
                text=_PAGE.format(title=title, kind=kind, refresh=int(refresh * 1000)), content_type="text/html"
            )

        return handler

    async def app_js(request: web.Request) -> web.Response:
        return web.Response(text=_JS, content_type="application/javascript")

    async def app_css(request: web.Request) -> web.Response:
        return web.Response(text=_CSS, content_type="text/css")

    async def api_jobs(request: web.Request) -> web.Response:
        from fray_core.status import JobStatus

        allowed = [s.value for s in JobStatus]
        asked = [w.strip().upper() for w in request.query.get("status", "").split(",") if w.strip()]
        bad = [w for w in asked if w not in allowed]
        if bad:  # a typo would otherwise look like "no such jobs"
            return web.json_response(
                {"error": f"status: unknown {bad[0]!r}; expected {', '.join(allowed)} (comma-separated)"}, status=400
            )
        infos = await blocking(cluster.list_jobs)
        infos = _filter(infos, request.query.get("status"), request.query.get("name"))
        return web.json_response([job_json(i) for i in infos], headers={"X-Fray-Now": repr(time.time())})

    async def api_job(request: web.Request) -> web.Response:
        try:
            info = await blocking(cluster.poll, request.match_info["job_id"])
        except (JobNotFoundError, RecordError) as e:
            return web.json_response({"error": str(e)}, status=404)
        return web.json_response({**job_json(info), "now": time.time()})

    async def api_logs(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        try:
            await blocking(cluster.poll, job_id)
            tails = await blocking(log_tails, cluster, job_id)
        except (JobNotFoundError, RecordError) as e:
            return web.json_response({"error": str(e)}, status=404)
        return web.json_response({"hosts": tails})

    async def api_fleet(request: web.Request) -> web.Response:
        infos = await blocking(cluster.list_jobs)
        fleet = fleet_json(cluster, infos)
        if fleet is None:
            return web.json_response({"error": "this cluster has no simulated fleet"}, status=404)
        return web.json_response(fleet)

    app = web.Application(middlewares=[guard])
    app.router.add_get("/", page("jobs", "list"))
    app.router.add_get("/job/{job_id}", page("job", "job"))
    app.router.add_get("/fleet", page("fleet", "fleet"))
    app.router.add_get("/static/app.js", app_js)
    app.router.add_get("/static/app.css", app_css)
    app.router.add_get("/api/jobs", api_jobs)
    app.router.add_get("/api/jobs/{job_id}", api_job)
    app.router.add_get("/api/jobs/{job_id}/logs", api_logs)
    app.router.add_get("/api/fleet", api_fleet)
    return app


def serve(
    cluster: Cluster, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, refresh: float = 2.0, ready: Any = None
) -> None:
    """Serve the dashboard until interrupted. ``port=0`` picks a free port; ``ready(url)`` is called once
    it listens (``fray dashboard`` prints the URL)."""
    from aiohttp import web

    async def main() -> None:
        # filled once the port is known; a name other than this address is refused (DNS rebinding). Served on
        # purpose beyond this machine (--host 0.0.0.0), any name that reaches it is answered.
        allowed: set[str] | None = set() if host in ("127.0.0.1", "localhost", "::1") else None
        runner = web.AppRunner(make_app(cluster, allowed_hosts=allowed, refresh=refresh), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1] if runner.addresses else port
        if allowed is not None:
            allowed.update({f"{host}:{bound}", f"localhost:{bound}", f"127.0.0.1:{bound}", f"[::1]:{bound}"})
        if ready is not None:
            ready(f"http://{'[' + host + ']' if ':' in host else host}:{bound}/")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>fray: {title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/app.css"></head>
<body data-page="{kind}" data-refresh="{refresh}">
<header><a href="/" class="brand">fray</a> <a href="/">jobs</a> <a href="/fleet" id="fleet-link">fleet</a>
<span id="updated" class="muted"></span></header>
<main id="main"><p class="muted">loading...</p></main>
<script src="/static/app.js"></script>
</body></html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f7f8fa; }
header { background: #1d2330; color: #fff; padding: 10px 20px; display: flex; gap: 18px; align-items: baseline; }
header a { color: #cfd8ea; text-decoration: none; } header a.brand { color: #fff; font-weight: 700; font-size: 17px; }
#updated { margin-left: auto; font-size: 12px; color: #9aa6bd; }
main { padding: 16px 20px; }
h1 { font-size: 20px; margin: 4px 0 12px; word-break: break-all; } h2 { font-size: 15px; margin: 22px 0 8px; }
table { border-collapse: collapse; width: 100%; background: #fff; box-shadow: 0 1px 2px #0001; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e8ebf0; vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; color: #5b6475; background: #fafbfc; }
td.mono, .mono { font-family: ui-monospace, monospace; font-size: 12px; }
.muted { color: #8a93a5; } .reason { color: #8a5a00; font-size: 12px; }
.status { font-weight: 600; padding: 1px 6px; border-radius: 3px; font-size: 12px; }
.s-RUNNING { background: #dbe9ff; color: #1f55b3; } .s-PENDING { background: #fff1d6; color: #8a5a00; }
.s-SUCCEEDED { background: #dcf5e3; color: #17733a; } .s-FAILED { background: #fde0e0; color: #b02525; }
.s-STOPPED { background: #eceef2; color: #4a5263; } .s-UNKNOWN { background: #f3e3ff; color: #6b2aa0; }
.filters { display: flex; gap: 10px; margin-bottom: 12px; align-items: center; }
.filters input, .filters select { padding: 4px 6px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; background: #fff; padding: 12px; margin: 0; }
dt { color: #5b6475; } dd { margin: 0; word-break: break-word; }
svg { background: #fff; box-shadow: 0 1px 2px #0001; }
.legend { display: flex; gap: 14px; flex-wrap: wrap; font-size: 12px; margin: 6px 0; }
.legend i {
  display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px; border-radius: 2px;
}
.logs { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
.log { background: #10141c; color: #d6dde8; padding: 8px; border-radius: 4px; overflow: auto; max-height: 260px; }
.log h3 { margin: 0 0 6px; font-size: 12px; color: #8fb4ff; }
.log pre { margin: 0; white-space: pre-wrap; word-break: break-all; }
pre.request { background: #fff; padding: 10px; overflow: auto; }
"""

_JS = r"""
"use strict";
const COLORS = {between: "#e3e6ec", waiting: "#c9ced8", holding: "#a9c4f0", running: "#4f8cf0",
  SUCCEEDED: "#36a55a", PREEMPTED: "#f0a02a",
  FAILED: "#d84a4a", CANCELLED: "#9aa1ad", UNSCHEDULABLE: "#a368d6", RESIZED: "#5fc0c0",
  STALLED: "#8a5a2b"};
const LABELS = {between: "before the attempt (launch, retry backoff)", waiting: "waiting for slices",
  holding: "holding slices, hosts starting", running: "running",
  SUCCEEDED: "succeeded", PREEMPTED: "preempted", FAILED: "failed", CANCELLED: "stopped",
  UNSCHEDULABLE: "unschedulable",
  RESIZED: "resized", STALLED: "stalled (no heartbeat)"};
const body = document.body, main = document.getElementById("main");
const REFRESH = parseInt(body.dataset.refresh, 10) || 2000;

function el(tag, attrs, ...kids) {
  const e = tag.startsWith("svg:") ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
                                   : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));  // text, never markup
  return e;
}
function age(s) { s = Math.max(0, Math.floor(s)); return s < 60 ? s + "s" : s < 3600 ? Math.floor(s / 60) + "m"
  : s < 86400 ? Math.floor(s / 3600) + "h" : Math.floor(s / 86400) + "d"; }
function dur(s) {
  return s == null ? "-" : s < 60 ? s.toFixed(1) + "s" :
    Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
}
function goodput(j) { const g = j.goodput; if (!g) return "-";
  if (j.status === "STOPPED") return "- (stopped)"; return Math.round(g.ratio * 100) + "%"; }
function errorLine(j) {  // a backend's error can end on "last output:" with the output in the attempt's cause
  const e = j.error || "", a = j.attempts[j.attempts.length - 1], tail = ((a && a.cause) || "").trim().split("\n");
  return e.trim().endsWith(":") && tail.length > 1 ? e.trim() + " " + tail[tail.length - 1].trim() : e;
}
function badge(status) { return el("span", {class: "status s-" + status}, status); }
async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  if (!r.ok) throw new Error((await r.json()).error || r.statusText);
  return r.json();
}
function stamp() {
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString() + " (live)";
}

// ------------------------------------------------------------------------------------------ job list
let filters = {status: "", name: ""};
function listView() {
  const status = el("select", {id: "f-status"}, el("option", {value: ""}, "any status"),
    ...["PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED"].map(s => el("option", {value: s}, s)));
  const name = el("input", {id: "f-name", placeholder: "name glob, e.g. train*"});
  status.value = filters.status; name.value = filters.name;
  status.onchange = () => { filters.status = status.value; refresh(); };
  name.oninput = () => { filters.name = name.value; refresh(); };
  const table = el("table", {id: "jobs"}, el("thead", {}, el("tr", {}, ...["id", "name", "status", "age", "attempts",
    "preempt/fail", "goodput", "pending reason / error"].map(h => el("th", {}, h)))), el("tbody"));
  main.replaceChildren(el("h1", {}, "jobs"), el("div", {class: "filters"}, status, name), table);
  async function refresh() {
    const q = new URLSearchParams();
    if (filters.status) q.set("status", filters.status);
    if (filters.name) q.set("name", filters.name);
    const jobs = await getJSON("/api/jobs?" + q), now = Date.now() / 1000;
    const rows = jobs.reverse().map(j => el("tr", {"data-job": j.job_id},
      el("td", {class: "mono"}, el("a", {href: "/job/" + encodeURIComponent(j.job_id)}, j.job_id)),
      el("td", {}, j.name), el("td", {}, badge(j.status)), el("td", {}, age(now - j.submitted_at)),
      el("td", {}, j.attempts.length), el("td", {}, j.preemptions + "/" + j.failures), el("td", {}, goodput(j)),
      el("td", {class: "reason"}, j.pending_reason || (j.status === "FAILED" ? errorLine(j) : ""))));
    table.tBodies[0].replaceChildren(
      ...(rows.length ? rows : [el("tr", {}, el("td", {colspan: 8, class: "muted"}, "no jobs"))]));
    stamp();
  }
  return refresh;
}

// ------------------------------------------------------------------------------------------ job page
function timeline(j) {
  const now = j.now || Date.now() / 1000, atts = j.attempts;
  const starts = [j.submitted_at, ...atts.map(a => a.started_at)].filter(t => t), t0 = Math.min(...starts);
  const ended = j.finished_at && ["SUCCEEDED", "FAILED", "STOPPED"].includes(j.status);
  const t1 = Math.max(ended ? j.finished_at : now, ...atts.map(a => a.ended_at || 0), t0 + 1e-3);
  const rows = [];
  for (const a of atts)
    for (const s of (a.slices.length ? a.slices : ["(waiting)"])) if (!rows.includes(s)) rows.push(s);
  const W = 900, L = 130, H = 26, top = 10, width = W - L - 20, x = t => L + (t - t0) / (t1 - t0) * width;
  const svg = el("svg:svg", {id: "timeline", width: W, height: top + rows.length * H + 34,
                            viewBox: `0 0 ${W} ${top + rows.length * H + 34}`});
  rows.forEach((r, i) => svg.append(el("svg:text", {x: 6, y: top + i * H + 17, "font-size": 12, fill: "#333"}, r)));
  const seen = new Set();
  let prevEnd = j.submitted_at;
  for (const a of atts) {  // the wait before an attempt got its slices (queued, backing off), on its slices' rows
    if (a.slices.length && a.started_at && prevEnd && a.started_at - prevEnd > (t1 - t0) / 200) {
      // a record with acquired_at began the attempt when it began to wait for slices: the gap before it is
      // the launch or the retry backoff; in older records the attempt began with its slices
      const key = a.acquired_at ? "between" : "waiting";
      seen.add(key);
      for (const s of a.slices) {
        const w = el("svg:rect", {x: x(prevEnd), y: top + rows.indexOf(s) * H + 8,
                                  width: Math.max(x(a.started_at) - x(prevEnd), 1),
          height: H - 18, rx: 2, fill: COLORS[key], class: "wait", "data-attempt": a.index});
        w.append(el("svg:title", {}, `attempt ${a.index} ${LABELS[key]}: ${dur(a.started_at - prevEnd)}`));
        svg.append(w);
      }
    }
    prevEnd = a.ended_at || prevEnd;
  }
  const phase = (cls, from, to, fill, y, what) => {  // one phase of an attempt on one slice's row
    const r = el("svg:rect", {x: x(from), y: y, width: Math.max(x(to) - x(from), 1), height: H - 8, rx: 3,
      fill: COLORS[fill], class: cls, "data-attempt": what.index});
    r.append(el("svg:title", {}, `attempt ${what.index} ${LABELS[fill]}: ${dur(to - from)}`));
    svg.append(r); seen.add(fill);
  };
  for (const a of atts) {
    // hosts in the backend's own queue hold nothing yet (no acquired_at) while the job says why it waits
    const queued = !a.outcome && !a.acquired_at && !!j.pending_reason;
    const kind = a.outcome || (a.slices.length && !queued ? "running" : "waiting");
    const fill = a.slices.length ? kind : "waiting"; seen.add(fill);
    const end = a.ended_at || (ended ? j.finished_at : now);
    // recorded since the attempt began to wait (started_at): the wait for its slices (to acquired_at), holding
    // them while its hosts start (to hosts_started_at), then running; older records have only started_at
    const held = a.slices.length && a.acquired_at ? a.acquired_at : null;
    const run = held ? (a.hosts_started_at || end) : (a.started_at || t0);
    const x0 = x(run), x1 = Math.max(x(end), x0 + 2);
    for (const s of (a.slices.length ? a.slices : ["(waiting)"])) {
      const y = top + rows.indexOf(s) * H + 3;
      const visible = (t1 - t0) / 200;  // a phase shorter than that is not drawn, nor put in the legend
      if (held && a.started_at && held - a.started_at > visible) phase("wait", a.started_at, held, "waiting", y, a);
      if (held && run - held > visible) phase("hold", held, run, "holding", y, a);
      const bar = el("svg:rect", {x: x0, y: y, width: x1 - x0, height: H - 8, rx: 3, fill: COLORS[fill] || "#888",
        class: "bar", "data-attempt": a.index, "data-outcome": kind});
      bar.append(el("svg:title", {},
        `attempt ${a.index} on ${s}: ${LABELS[kind] || kind}, ${dur(end - run)}` +
        (a.cause ? "\n" + a.cause : "")));
      const label = held ? x(held) : x0;
      svg.append(bar, el("svg:text", {x: label + 4, y: y + 14, "font-size": 11, fill: "#fff"}, String(a.index)));
      if (a.outcome === "PREEMPTED" && (a.cause || "").includes("(" + s + ")"))
        svg.append(el("svg:path", {d: `M${x1 - 6},${y - 3} l6,8 l6,-8 z`, fill: "#b35c00"}));
    }
  }
  const axisY = top + rows.length * H + 14;
  svg.append(el("svg:line", {x1: L, x2: L + width, y1: axisY - 8, y2: axisY - 8, stroke: "#bbb"}));
  for (let k = 0; k <= 4; k++) { const t = (t1 - t0) * k / 4;
    svg.append(el("svg:text", {x: L + width * k / 4 - 8, y: axisY + 8, "font-size": 11, fill: "#666"}, dur(t))); }
  const legend = el("div", {class: "legend"},
    ...[...seen].map(k => el("span", {}, el("i", {style: null, "data-c": k}), LABELS[k] || k)));
  legend.querySelectorAll("i").forEach(i => { i.style.background = COLORS[i.dataset.c]; });
  return [svg, legend];
}
function jobView() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  async function refresh() {
    let j;
    try { j = await getJSON("/api/jobs/" + encodeURIComponent(id)); }
    catch (e) { main.replaceChildren(el("h1", {}, id), el("p", {class: "muted"}, String(e.message))); return; }
    const fields = [["status", badge(j.status)], ["name", j.name], ["kind", j.kind], ["backend", j.backend],
      ["submitted", new Date(j.submitted_at * 1000).toLocaleString()],
      ["finished", j.finished_at ? new Date(j.finished_at * 1000).toLocaleString() : "-"],
      ["progress", j.progress || "-"], ["pending", j.pending_reason || "-"], ["error", errorLine(j) || "-"],
      ["retries", `preemptions ${j.preemptions} of ${j.max_retries_preemption}, ` +
        `failures ${j.failures} of ${j.max_retries_failure}`],
      ["goodput", j.goodput ? goodput(j) +
        ` (productive ${j.goodput.productive_s.toFixed(1)}s, pending ${j.goodput.pending_s.toFixed(1)}s,` +
        ` lost ${j.goodput.lost_s.toFixed(1)}s)` : "-"]];
    const dl = el("dl", {id: "fields"});
    for (const [k, v] of fields) dl.append(el("dt", {}, k), el("dd", {"data-field": k}, v));
    const att = el("table", {id: "attempts"},
      el("thead", {}, el("tr", {}, ...["attempt", "slices", "outcome", "duration", "cause"].map(h => el("th", {}, h)))),
      el("tbody", {}, ...j.attempts.map(a => el("tr", {}, el("td", {}, a.index),
        el("td", {class: "mono"}, a.slices.join(", ") || "-"),
        el("td", {}, a.outcome || (a.slices.length ? "RUNNING" : "WAITING")),
        el("td", {}, dur((a.ended_at || j.now) - (a.started_at || j.submitted_at))),
        el("td", {class: "mono"}, a.cause || "")))));
    const logs = el("div", {class: "logs", id: "logs"});
    try {
      const tails = (await getJSON("/api/jobs/" + encodeURIComponent(id) + "/logs")).hosts;
      for (const [tag, lines] of Object.entries(tails))
        logs.append(el("div", {class: "log"}, el("h3", {}, tag), el("pre", {}, lines.join("\n"))));
      if (!Object.keys(tails).length) logs.append(el("p", {class: "muted"}, "no output yet"));
    } catch (e) { logs.append(el("p", {class: "muted"}, String(e.message))); }
    main.replaceChildren(el("h1", {}, j.job_id), dl, el("h2", {}, "timeline"),
      ...(j.attempts.length ? timeline(j) : [el("p", {class: "muted"}, "no attempt yet")]),
      el("h2", {}, "attempts"), att, el("h2", {}, "last output, per host"), logs,
      el("h2", {}, "request"), el("pre", {class: "request mono"}, JSON.stringify(j.request, null, 2)));
    stamp();
  }
  return refresh;
}

// --------------------------------------------------------------------------------------------- fleet
function fleetView() {
  async function refresh() {
    let f;
    try { f = await getJSON("/api/fleet"); }
    catch (e) { main.replaceChildren(el("h1", {}, "fleet"), el("p", {class: "muted"}, String(e.message))); return; }
    const rows = f.slices.map(s => el("tr", {"data-slice": s.name},
      el("td", {class: "mono"}, s.name), el("td", {}, s.type),
      el("td", {}, s.hosts), el("td", {}, s.state),
      el("td", {class: "mono"}, s.holder ? el("a", {href: "/job/" + encodeURIComponent(s.holder)}, s.holder) : "-"),
      el("td", {}, s.preemptions), el("td", {}, s.quarantined ? "quarantined: " + (s.quarantine_note || "") : "-")));
    main.replaceChildren(el("h1", {}, "fleet" + (f.on_demand ? " (slices made on demand)" : "")),
      el("table", {id: "fleet"},
        el("thead", {}, el("tr", {},
          ...["slice", "type", "hosts", "state", "held by", "preemptions", "quarantine"].map(h => el("th", {}, h)))),
        el("tbody", {},
          ...(rows.length ? rows : [el("tr", {}, el("td", {colspan: 7, class: "muted"}, "no slices"))]))));
    stamp();
  }
  return refresh;
}

const refresh = {list: listView, job: jobView, fleet: fleetView}[body.dataset.page]();
async function loop() {
  try { await refresh(); } catch (e) { document.getElementById("updated").textContent = "error: " + e.message; }
  setTimeout(loop, REFRESH); }
loop();
"""
