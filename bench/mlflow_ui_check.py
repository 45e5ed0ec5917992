"""Which view MLflow's UI opens rlvrlab's experiments in, checked in a headless browser (issue 38, item 5).

MLflow 3's UI has two views of an experiment: GenAI (traces, sessions, judges), where rlvrlab's training runs do not
show, and Model training (the runs table). rlvrlab marks its experiments as model training with MLflow's own tag
(mlflow.experimentKind=custom_model_development) and prints an address that asks for the Model training view
(rlvrlab.tracking.mlflow_tracker.ui_address). This script trains a few toy steps with `rlvrlab train` into a fresh
sqlite store, serves it with `mlflow server`, and opens in headless Chromium:

  printed     the address `rlvrlab train` printed                   -> must be the runs table (Model training)
  plain       http://HOST/#/experiments/ID in a fresh browser       -> reported: the view MLflow picks by itself
  switched    the same, after one click on the sidebar's "Model training" switch (kept in the browser)
                                                                    -> must be the runs table

and exits 1 when a "must" fails. Seen with MLflow 3.17.2 and Chromium 156 (Debian), 2026-12-06: printed and
switched open the runs table; plain opens the GenAI overview although the tag is set (3.17.2's UI takes the view
from its switch, not from the tag).

Needs Chromium with its driver and selenium, none of which rlvrlab installs:

    apt-get install chromium chromium-driver     # Debian: /usr/bin/chromium, /usr/bin/chromedriver
    .venv/bin/pip install selenium
    .venv/bin/python bench/mlflow_ui_check.py     # about a minute
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS_PAGE = re.compile(r"#/experiments/(\d+)/runs(\?|$)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train(folder: Path) -> tuple[str, str, str]:
    """`rlvrlab train toy` for 3 steps: (store uri, run id, the address it printed)."""
    result = subprocess.run([sys.executable, "-m", "rlvrlab.cli.main", "train", "toy", "steps=3",
                             f"output_dir={folder}"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if result.returncode != 0:
        sys.exit(f"rlvrlab train failed:\n{result.stderr[-2000:]}")
    run_id = re.search(r"MLflow run (\w+)", result.stdout)
    printed = re.search(r"then open (\S+)", result.stdout)
    if run_id is None or printed is None:
        sys.exit(f"rlvrlab train printed no run id or address:\n{result.stdout}")
    return f"sqlite:///{folder / 'mlflow.db'}", run_id.group(1), printed.group(1)


def serve(uri: str, port: int, log: Path) -> subprocess.Popen:
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    server = subprocess.Popen([mlflow, "server", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port",
                               str(port), "--workers", "1"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)  # its uvicorn and job-runner children end with it (`stop`)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(1)
    stop(server)
    sys.exit(f"mlflow server did not answer on port {port} within 180 s; its log: {log}")


def stop(server: subprocess.Popen) -> None:
    import signal

    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)


def browser(chromium: str, driver: str):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        sys.exit("selenium is not installed: .venv/bin/pip install selenium")
    for path in (chromium, driver):
        if not Path(path).is_file():
            sys.exit(f"{path} not found: apt-get install chromium chromium-driver (or give --chromium/--driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,900"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


def settle(page, timeout: float = 60.0) -> tuple[str, str]:
    """(address, visible text) once the UI has finished redirecting and drawing (unchanged for 3 s)."""
    last, since = ("", ""), time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        now = (page.current_url, page.find_element("tag name", "body").text)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 3 and now[1].strip():
            break
    return last


def view(address: str, text: str, run_name: str) -> str:
    """'model training' when the page is the experiment's runs table with the run in it, else what it is."""
    if RUNS_PAGE.search(address) and run_name in text:
        return "model training"
    if "workflowType=genai" in address or "/overview" in address:
        return "genai"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--driver", default="/usr/bin/chromedriver")
    args = parser.parse_args()
    from mlflow.tracking import MlflowClient

    page = browser(args.chromium, args.driver)
    failures = []
    with tempfile.TemporaryDirectory(prefix="rlvrlab-ui-") as scratch:
        folder = Path(scratch)
        uri, run_id, printed = train(folder / "runs")
        client = MlflowClient(tracking_uri=uri)
        run = client.get_run(run_id)
        kind = client.get_experiment(run.info.experiment_id).tags.get("mlflow.experimentKind")
        print(f"experiment {run.info.experiment_id}: mlflow.experimentKind={kind}")
        if kind != "custom_model_development":
            failures.append("the experiment is not tagged mlflow.experimentKind=custom_model_development")
        port = free_port()
        server = serve(uri, port, folder / "server.log")
        host = f"http://127.0.0.1:{port}"
        try:
            checks = [("printed", printed.replace("http://127.0.0.1:5000", host), True),
                      ("plain", f"{host}/#/experiments/{run.info.experiment_id}", False)]
            for name, address, must in checks:
                page.delete_all_cookies()
                page.get(host)
                page.execute_script("window.localStorage.clear()")  # a browser that never chose a view
                page.get(address)
                final, text = settle(page)
                seen = view(final, text, run.info.run_name)
                print(f"{name:9s} {address}\n          -> {final}\n          -> {seen} view")
                if must and seen != "model training":
                    failures.append(f"{name}: {seen} view, not model training")
            # the user's own way: one click on the sidebar's switch, remembered by the browser
            switch = page.find_elements(
                "xpath", "//*[@role='button'][.//*[normalize-space(text())='Model training']]")
            if not switch:
                failures.append("switched: no 'Model training' switch on the page")
            else:  # a script's click: the GenAI view's first-visit popover lies over the sidebar
                page.execute_script("arguments[0].click()", switch[-1])
                settle(page)
                page.get(f"{host}/#/experiments/{run.info.experiment_id}")
                final, text = settle(page)
                seen = view(final, text, run.info.run_name)
                print(f"switched  {host}/#/experiments/{run.info.experiment_id} after one click on 'Model training'"
                      f"\n          -> {final}\n          -> {seen} view")
                if seen != "model training":
                    failures.append(f"switched: {seen} view, not model training")
        finally:
            page.quit()
            stop(server)
    import mlflow

    print(f"MLflow {mlflow.__version__}; {'OK' if not failures else 'FAILED: ' + '; '.join(failures)}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    main()
