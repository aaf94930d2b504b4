"""``fray dashboard``: its JSON API over HTTP, and its pages in a real headless browser (Debian's chromium and
chromium-driver, driven by selenium): the list loads and lists jobs, a job page draws its timeline, live
refresh shows a state change, job bytes stay text.

Without chromium the browser tests skip, saying why; under CI (``CI=true``, where .ci/run installs it) they
fail instead, so a CI machine without a browser cannot pass them by skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import FRAY

from fray_core.records import JobStore, owner_info
from fray_core.types import Attempt, AttemptOutcome, Goodput, JobInfo, JobStatus

HOSTILE = '<img src=x id=pwned onerror="document.title=1">\x1b]0;t\x07'
IN_CI = os.environ.get("CI", "").lower() == "true"


def _plant(store: JobStore) -> dict[str, str]:
    now = time.time()
    store.write(
        JobInfo(
            job_id="sim-1",
            name="sim",
            status=JobStatus.SUCCEEDED,
            submitted_at=now - 60,
            finished_at=now - 50,
            preemptions=1,
            attempts=[
                Attempt(
                    0,
                    ["v4-16-0", "v4-16-1"],
                    now - 59,
                    now - 56,
                    AttemptOutcome.PREEMPTED,
                    "preempted on slice 0 (v4-16-0) host 1",
                ),
                Attempt(1, ["v4-16-0", "v4-16-1"], now - 55, now - 50, AttemptOutcome.SUCCEEDED),
            ],
            goodput=Goodput(pending_s=2.0, productive_s=5.0, lost_s=3.0),
            request_summary={
                "entrypoint": "train:main",
                "device": {"kind": "tpu", "type": "v4-16", "hosts": 2},
                "replicas": 2,
            },
        ),
        owner=owner_info(),
    )
    Path(store.log_path("sim-1")).write_text("[a0 s0/h0] step 0\n[a1 s0/h0] step 9\n[a1 s1/h1] done \x1b[2J\n")
    store.write(
        JobInfo(
            job_id="hostile-1",
            name=HOSTILE,
            status=JobStatus.FAILED,
            error=HOSTILE,
            submitted_at=now - 30,
            finished_at=now - 29,
        ),
        owner=owner_info(),
    )
    store.write(
        JobInfo(
            job_id="waiting-1",
            name="waiting",
            status=JobStatus.PENDING,
            submitted_at=now - 10,
            pending_reason="queued: 1st for 2 x v4-16",
        ),
        owner=owner_info(),
    )  # this process owns it: alive
    phases = Attempt(0, ["v4-16-0"], now - 40, now - 20, AttemptOutcome.FAILED, "boom")
    phases.acquired_at, phases.hosts_started_at = now - 34, now - 30  # waited 6 s, hosts started in 4 s, ran 10 s
    store.write(
        JobInfo(
            job_id="phases-1",
            name="phases",
            status=JobStatus.FAILED,
            error="boom",
            submitted_at=now - 40,
            finished_at=now - 20,
            failures=1,
            attempts=[phases],
        ),
        owner=owner_info(),
    )
    return {"sim": "sim-1", "hostile": "hostile-1", "waiting": "waiting-1", "phases": "phases-1"}


class Dashboard:
    def __init__(self, proc: subprocess.Popen[str], url: str, store: JobStore) -> None:
        self.proc, self.url, self.store = proc, url, store

    def get(self, path: str, host: str | None = None, method: str = "GET") -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path.lstrip("/"), method=method)
        if host:
            req.add_header("Host", host)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read().decode()
                return r.status, json.loads(body) if r.headers.get_content_type() == "application/json" else body
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    tmp = tmp_path_factory.mktemp("dashboard")
    store = JobStore(str(tmp / "jobs"))
    _plant(store)
    env = {k: v for k, v in os.environ.items() if k not in ("FRAY_CLUSTER_SPEC", "RAY_ADDRESS")}
    env.update(FRAY_JOBS_DIR=str(tmp / "jobs"), XDG_CONFIG_HOME=str(tmp / "config"))
    proc = subprocess.Popen(
        [*FRAY, "dashboard", "--port", "0", "--refresh", "0.3", "--cluster", "local?tpu=v4-16:2"],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "fray dashboard: http://127.0.0.1:PORT/ (read-only; ...)"
        assert line.startswith("fray dashboard: http://127.0.0.1:"), line + (
            proc.stderr.read() if proc.poll() is not None else ""
        )  # type: ignore[union-attr]
        yield Dashboard(proc, line.split()[2], store)
    finally:
        proc.terminate()
        proc.wait(30)


# ----------------------------------------------------------------------------------------------- API


def test_api_has_the_json_fields_of_the_cli(dash: Dashboard) -> None:
    from fray_core.cli.output import JOB_FIELDS

    status, jobs = dash.get("/api/jobs")
    assert status == 200 and {j["job_id"] for j in jobs} >= {"sim-1", "hostile-1", "waiting-1", "phases-1"}
    assert all(set(j) == set(JOB_FIELDS) for j in jobs)
    status, one = dash.get("/api/jobs/sim-1")
    assert status == 200 and one["attempts"][0]["outcome"] == "PREEMPTED" and one["goodput"]["productive_s"] == 5.0
    assert [j["job_id"] for j in dash.get("/api/jobs?status=pending")[1]] == ["waiting-1"]
    assert [j["job_id"] for j in dash.get("/api/jobs?name=si*")[1]] == ["sim-1"]
    status, body = dash.get("/api/jobs?status=runing")  # a typo is said, not an empty list
    assert status == 400 and "status: unknown 'RUNING'; expected PENDING, RUNNING" in body, body
    status, logs = dash.get("/api/jobs/sim-1/logs")
    assert logs["hosts"] == {"[a0 s0/h0]": ["step 0"], "[a1 s0/h0]": ["step 9"], "[a1 s1/h1]": ["done \x1b[2J"]}
    assert list(logs["hosts"]) == ["[a1 s0/h0]", "[a1 s1/h1]", "[a0 s0/h0]"]  # the latest attempt's hosts first
    assert dash.get("/api/jobs/nope")[0] == 404
    fleet = dash.get("/api/fleet")[1]
    assert [s["name"] for s in fleet["slices"]] == ["v4-16-0", "v4-16-1"] and fleet["capacity"] == {"v4-16": 2}


def test_read_only_and_only_for_its_own_address(dash: Dashboard) -> None:
    assert dash.get("/api/jobs", method="POST")[0] == 405
    assert dash.get("/api/jobs", method="DELETE")[0] == 405
    status, body = dash.get("/api/jobs", host="attacker.example:80")  # DNS rebinding: another name, same address
    assert status == 421 and "sim-1" not in body
    assert dash.get("/../../etc/passwd")[0] == 404
    status, page = dash.get("/")
    assert status == 200 and "sim-1" not in page  # pages hold no job data: the script fetches it as JSON


def test_import_fray_core_does_not_load_the_dashboard() -> None:
    code = "import sys, fray_core, fray_core.cli; assert not {'aiohttp', 'fray_core.dashboard'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    problem = None
    if not chromium or not driver_path:
        problem = "Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    else:
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
        except ModuleNotFoundError:
            problem = "selenium is not installed (the test extra: python -m pip install -e '.[test]')"
    if problem:
        if IN_CI:
            pytest.fail(f"CI=true but {problem}: .ci/run installs them")
        pytest.skip(problem)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, predicate: Any, what: str, timeout: float = 30) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: predicate(d))
    except Exception as e:
        raise AssertionError(f"timed out waiting for {what}; page: {driver.page_source[:3000]}") from e


_ROWS = (
    "return [...document.querySelectorAll(arguments[0])].map(r => [r.dataset.job || r.dataset.slice, "
    "[...r.cells].map(c => c.textContent)])"
)


def _rows(driver: Any, selector: str) -> dict[str, list[str]]:
    """The rows of a table as ``{key: [cell text...]}``, read in one script call (the page redraws itself)."""
    return {k: v for k, v in driver.execute_script(_ROWS, selector) if k}


def test_browser_lists_jobs_and_keeps_job_bytes_as_text(dash: Dashboard, browser: Any) -> None:
    browser.get(dash.url)
    _wait(browser, lambda d: "sim-1" in _rows(d, "#jobs tbody tr"), "the job list")
    rows = _rows(browser, "#jobs tbody tr")
    assert set(rows) >= {"sim-1", "hostile-1", "waiting-1"}
    assert rows["sim-1"][1:3] == ["sim", "SUCCEEDED"] and rows["sim-1"][4:7] == ["2", "1/0", "50%"], rows["sim-1"]
    assert rows["sim-1"][3] in ("1m", "2m") and rows["waiting-1"][3].endswith(("s", "m")), rows  # AGE
    assert "queued: 1st for 2 x v4-16" in rows["waiting-1"][7]
    assert rows["hostile-1"][1] == HOSTILE  # shown as text
    assert browser.execute_script("return document.getElementById('pwned')") is None  # never parsed as markup
    assert browser.title == "fray: jobs"
    # the filters: a name glob, then a status, narrow the rows on the same page
    browser.find_element("id", "f-name").send_keys("si*")
    _wait(browser, lambda d: set(_rows(d, "#jobs tbody tr")) == {"sim-1"}, "the name filter")
    browser.find_element("id", "f-name").send_keys("\b\b\b")  # typed away, as a user would (clear() fires no input)
    browser.execute_script("const s = document.getElementById('f-status'); s.value = 'FAILED'; s.onchange()")
    _wait(browser, lambda d: set(_rows(d, "#jobs tbody tr")) == {"hostile-1", "phases-1"}, "the status filter")


_BARS = (
    "return [...document.querySelectorAll('svg#timeline rect.bar')].map(b => [b.dataset.attempt, "
    "b.dataset.outcome, b.getAttribute('width')])"
)


def test_browser_job_page_draws_the_timeline(dash: Dashboard, browser: Any) -> None:
    browser.get(dash.url + "job/sim-1")
    bars = _wait(browser, lambda d: d.execute_script(_BARS), "the timeline")
    assert sorted((a, o) for a, o, _ in bars) == [
        ("0", "PREEMPTED"),
        ("0", "PREEMPTED"),
        ("1", "SUCCEEDED"),
        ("1", "SUCCEEDED"),
    ]
    assert all(float(w) > 10 for _, _, w in bars)
    waits = browser.execute_script(
        "return [...document.querySelectorAll('svg#timeline rect.wait')].map(w => w.dataset.attempt)"
    )
    assert sorted(waits) == ["0", "0", "1", "1"]  # before each attempt got its two slices
    page = browser.execute_script(
        "return [[...document.querySelectorAll('svg#timeline > text')].map(t => t.textContent),"
        " document.getElementById('logs').textContent, document.querySelector('pre.request').textContent]"
    )
    labels, logs, request = page
    assert "v4-16-0" in labels and "v4-16-1" in labels
    assert "[a1 s1/h1]" in logs and "step 9" in logs and "done \x1b[2J" in logs
    assert '"entrypoint": "train:main"' in request


_PHASES = (
    "return [...document.querySelectorAll('svg#timeline rect')].filter(r => r.dataset.attempt === '0')"
    ".map(r => [r.getAttribute('class'), +r.getAttribute('x'), +r.getAttribute('width')])"
)


def test_browser_timeline_draws_waiting_holding_and_running(dash: Dashboard, browser: Any) -> None:
    """One attempt in its three phases, each as long as it lasted: waiting for its slices, holding them while
    its hosts start, running (drawn in its outcome's colour)."""
    browser.get(dash.url + "job/phases-1")
    rects = _wait(browser, lambda d: len(d.execute_script(_PHASES)) == 3 and d.execute_script(_PHASES), "3 phases")
    (wait_x, wait_w), (hold_x, hold_w), (run_x, run_w) = [(x, w) for _, x, w in sorted(rects, key=lambda r: r[1])]
    assert [c for c, _, _ in sorted(rects, key=lambda r: r[1])] == ["wait", "hold", "bar"]
    assert abs(wait_x + wait_w - hold_x) < 1 and abs(hold_x + hold_w - run_x) < 1  # one after the other
    assert abs(wait_w / run_w - 0.6) < 0.05 and abs(hold_w / run_w - 0.4) < 0.05, rects
    legend = browser.find_element("css selector", ".legend").text
    assert "waiting for slices" in legend and "holding slices, hosts starting" in legend and "failed" in legend


def test_browser_timeline_draws_hosts_in_the_backends_queue_as_waiting(dash: Dashboard, browser: Any) -> None:
    """A one-replica Ray job's attempt holds nothing while its task waits in Ray's queue (no ``acquired_at``,
    the job's ``pending_reason`` says so): drawn in the waiting colour, never as running."""
    now = time.time()
    dash.store.write(
        JobInfo(
            job_id="queued-1",
            name="queued",
            status=JobStatus.PENDING,
            submitted_at=now - 10,
            attempts=[Attempt(0, ["ray"], now - 9)],
            pending_reason="waiting in Ray's queue for 1 x {CPU: 1}: the cluster has room for 4 in all, held by ...",
        ),
        owner=owner_info(),
    )
    try:
        browser.get(dash.url + "job/queued-1")
        fills = (
            "return [...document.querySelectorAll('svg#timeline rect')].filter(r => r.dataset.attempt === '0')"
            ".map(r => r.getAttribute('fill'))"
        )
        got = _wait(browser, lambda d: d.execute_script(fills), "the attempt's bar")
        assert got and set(got) == {"#c9ced8"}, got  # COLORS.waiting; running is #4f8cf0
        legend = browser.find_element("css selector", ".legend").text
        assert "waiting for slices" in legend and "running" not in legend, legend
    finally:
        dash.store.discard("queued-1")  # the other tests count the store's jobs


def test_browser_live_refresh_shows_a_state_change(dash: Dashboard, browser: Any) -> None:
    browser.get(dash.url)
    _wait(
        browser, lambda d: "PENDING" in _rows(d, "#jobs tbody tr").get("waiting-1", ["", "", ""])[2], "the pending job"
    )
    browser.execute_script("window.__same_page = true")  # gone if the page were reloaded
    now = time.time()
    dash.store.write(
        JobInfo(
            job_id="waiting-1",
            name="waiting",
            status=JobStatus.SUCCEEDED,
            submitted_at=now - 10,
            finished_at=now,
            attempts=[Attempt(0, ["v4-16-0"], now - 5, now, AttemptOutcome.SUCCEEDED)],
            goodput=Goodput(5.0, 5.0, 0.0),
        ),
        owner=owner_info(),
    )
    _wait(browser, lambda d: _rows(d, "#jobs tbody tr")["waiting-1"][2] == "SUCCEEDED", "the live refresh")
    assert browser.execute_script("return window.__same_page") is True


def test_browser_fleet_page(dash: Dashboard, browser: Any) -> None:
    now = time.time()
    dash.store.write(
        JobInfo(
            job_id="holder-1",
            name="holder",
            status=JobStatus.RUNNING,
            submitted_at=now,
            attempts=[Attempt(0, ["v4-16-1"], now)],
        ),
        owner=owner_info(),
    )
    browser.get(dash.url + "fleet")
    rows = _wait(browser, lambda d: _rows(d, "#fleet tbody tr"), "the fleet")
    assert rows["v4-16-1"][:2] == ["v4-16-1", "v4-16"] and rows["v4-16-1"][3:5] == ["busy", "holder-1"], rows
    assert rows["v4-16-0"][3:5] == ["free", "-"]


def test_without_the_extra_one_line_exit_2(tmp_path: Path) -> None:
    fake = tmp_path / "no_aiohttp" / "aiohttp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'aiohttp'\", name='aiohttp')\n")
    env = {
        **os.environ,
        "FRAY_JOBS_DIR": str(tmp_path / "jobs"),
        "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]),
    }
    r = subprocess.run(
        [*FRAY, "dashboard", "--port", "0"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "python -m pip install 'fray-jobs[dashboard]'" in r.stderr, r.stderr


@pytest.mark.parametrize("refresh", ["-1", "0", "nan", "inf"])
def test_bad_refresh_is_one_line_exit_2(refresh: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--refresh -1`` served a page that re-fetched in a tight loop (setTimeout of a negative delay)."""
    from fray_core.cli import main

    assert main(["dashboard", "--refresh", refresh]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument --refresh: expected seconds between 0.1 and 3600, got '{refresh}'" in err


def test_default_address_is_this_machine_on_a_port_that_is_not_rays() -> None:
    from fray_core.cli import build_parser
    from fray_core.dashboard import DEFAULT_HOST, DEFAULT_PORT

    args = build_parser().parse_args(["dashboard"])
    assert (args.host, args.port) == (DEFAULT_HOST, DEFAULT_PORT) == ("127.0.0.1", 8290)
    assert DEFAULT_PORT != 8265  # Ray's dashboard
    index = (Path(__file__).parent.parent / "docs" / "index.md").read_text()
    assert f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/" in index and "8265" in index


def test_address_in_use_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    from fray_core.cli import main

    monkeypatch.setenv("FRAY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--cluster", "local", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fray dashboard: error: cannot listen on 127.0.0.1:{port}: "), err
    assert "--port 0" in err  # how to get a free one


def test_fleet_json_holders_from_records_and_quarantines(tmp_path: Path) -> None:
    """The fleet view of ``fray dashboard --cluster 'local?tpu=...'``: the dashboard's own model of the fleet
    (each launch has its own, backends.md), so a slice that a job's record says it holds is shown busy, not
    free; a fleet run in the dashboard's process (``serve(cluster)`` from Python) shows its quarantines."""
    from fray_core.dashboard import fleet_json
    from fray_local import LocalCluster, TpuFleet

    cluster = LocalCluster(fleet=TpuFleet({"v4-16": 3}), jobs_dir=str(tmp_path / "jobs"))
    now = time.time()
    holder = JobInfo(job_id="holder-1", name="h", status=JobStatus.RUNNING, attempts=[Attempt(0, ["v4-16-1"], now)])
    cluster.fleet.model.device_failed("v4-16-2", 0)
    cluster.fleet.model.device_failed("v4-16-2", 0)
    fleet = fleet_json(cluster, [holder])
    assert fleet is not None
    rows = {s["name"]: s for s in fleet["slices"]}
    assert (rows["v4-16-0"]["state"], rows["v4-16-0"]["holder"]) == ("free", None)
    assert (rows["v4-16-1"]["state"], rows["v4-16-1"]["holder"]) == ("busy", "holder-1")
    assert rows["v4-16-2"]["quarantined"] and "device error twice" in rows["v4-16-2"]["quarantine_note"]
