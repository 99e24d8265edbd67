#!/usr/bin/env python
"""Screenshots of a real sweep in the MLflow UI, for the README (headless Chromium, no extra packages).

    raycpt ui CONFIG --port 5716 &                   # the run root holding the sweep
    python scripts/screenshot_mlflow.py --port 5716 --out docs/img

Writes ``mlflow_sweep_runs.png`` (the experiment's runs table, the newest parent sweep run expanded to
its trials) and ``mlflow_sweep_compare.png`` (MLflow's Compare view of those trials); with ``--overview``
``mlflow_parent_overview.png`` (the parent run's overview: its description, source, parameters) and
``mlflow_datasets.png`` (the same page scrolled to the datasets the run logged: corpus, slices, benchmarks);
with ``--tradeoff`` only
``mlflow_tradeoff.png``: the parent sweep run's artifact view opened on ``summary/tradeoff.png`` (domain gain
against forgetting, issue 37). Chromium runs
headless with a DevTools port; the page is driven over the DevTools protocol with aiohttp's websocket
client (aiohttp comes with ``ray[default]``). Needs Debian's ``chromium``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
from mlflow.tracking import MlflowClient

EXPAND_JS = """
(() => {
  const close = [...document.querySelectorAll('button')].find(b => /close/i.test(b.getAttribute('aria-label') || ''));
  if (close) close.click();  // the assistant side panel
  const btn = document.querySelector('[role="row"][row-id="%s"] button[data-component-id*="runnamecellrenderer"]');
  if (!btn) return 'expand button not found';
  btn.click();
  return 'expanded' + (close ? ', side panel closed' : '');
})()
"""


CLOSE_JS = """
(() => {
  const mode = [...document.querySelectorAll('label, button, span')].find(
    e => (e.textContent || '').trim() === 'Model training' && e.children.length === 0);
  if (mode) mode.click();  // MLflow 3.17 opens a fresh browser in its GenAI mode; runs and models show in this one
  const close = [...document.querySelectorAll('button')].find(b => /close/i.test(b.getAttribute('aria-label') || ''));
  if (close) close.click();  // the assistant side panel: the artifact gets the width
  return (close ? 'side panel closed' : 'no side panel') + (mode ? ', model training mode' : '');
})()
"""


DATASETS_JS = """
;(() => {
  const el = [...document.querySelectorAll('*')].find(e => e.children.length === 0 && /^Datasets( used)?$/.test((e.textContent || '').trim()));
  if (!el) return 'datasets heading not found';
  el.scrollIntoView({block: 'start'});
  const more = [...document.querySelectorAll('*')].find(e => e.children.length === 0 && /^\\+\\d+$/.test((e.textContent || '').trim()));
  if (more) more.click();  // the chip that opens the list of every dataset
  return 'scrolled to datasets' + (more ? ', list opened' : '');
})()
"""


SHOW_MORE_JS = """
;(() => {
  const more = [...document.querySelectorAll('button, a, span')].find(e => (e.textContent || '').trim() === 'Show more');
  if (more) more.click();  // the whole description: the question, the verdict, the command
  return more ? 'description expanded' : 'description short';
})()
"""


class Page:
    def __init__(self, ws):
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params):
        self.n += 1
        await self.ws.send_str(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.n:
                return msg.get("result", {})

    async def shot(self, url: str, out: Path | None, wait: float, js: str | None = None) -> None:
        """Open ``url``, run ``js``, write the screenshot to ``out`` (None: only open the page and run ``js``)."""
        await self.call("Page.navigate", url=url)
        await asyncio.sleep(wait)
        if js:
            r = await self.call("Runtime.evaluate", expression=js, returnByValue=True)
            print(out.name if out else url, "script:", r.get("result", {}).get("value"))
            await asyncio.sleep(wait / 2)
        if out is None:
            return
        data = (await self.call("Page.captureScreenshot", format="png"))["data"]
        out.write_bytes(base64.b64decode(data))
        print("wrote", out, out.stat().st_size, "bytes")


async def drive(devtools_port: int, shots: list[tuple[str, Path, float, str | None]], size: tuple[int, int]):
    with urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list") as r:
        target = next(t for t in json.loads(r.read()) if t["type"] == "page")
    async with aiohttp.ClientSession() as s, s.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
        page = Page(ws)
        await page.call("Page.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                        mobile=False)
        for url, out, wait, js in shots:
            await page.shot(url, out, wait, js)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=5000, help="port of the running `raycpt ui`")
    ap.add_argument("--tracking-uri", required=True, help="the store `raycpt ui` serves (sqlite:////...)")
    ap.add_argument("--experiment", default="raycpt")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--wait", type=float, default=25.0, help="seconds for the JS app to render each view")
    ap.add_argument("--tradeoff", action="store_true", help="only the parent run's summary/tradeoff.png artifact view")
    ap.add_argument("--overview", action="store_true", help="only the parent run's overview and its datasets")
    args = ap.parse_args()
    client = MlflowClient(args.tracking_uri)
    exp = client.get_experiment_by_name(args.experiment)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    parent = next(r for r in runs if r.data.tags.get("raycpt.command") == "sweep"
                  and "mlflow.parentRunId" not in r.data.tags)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    base = f"http://127.0.0.1:{args.port}/#/experiments/{exp.experiment_id}"
    ids = json.dumps([r.info.run_id for r in children])
    compare = f"http://127.0.0.1:{args.port}/#/compare-runs?runs={ids}&experiments={json.dumps([exp.experiment_id])}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = 9333
    profile = tempfile.mkdtemp(prefix="chromium-")
    chrome = subprocess.Popen([shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
                               f"--remote-debugging-port={port}", f"--user-data-dir={profile}",
                               "--window-size=1400,900", "about:blank"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=2)
                break
            except OSError:
                time.sleep(1)
        artifact = f"{base}/runs/{parent.info.run_id}/artifacts/summary/tradeoff.png"
        overview = f"{base}/runs/{parent.info.run_id}"
        shots = [(artifact, out / "mlflow_tradeoff.png", args.wait, CLOSE_JS)] if args.tradeoff else [
            (f"{base}/runs", None, args.wait, CLOSE_JS),  # the mode switch (it navigates), then the pages
            (overview, out / "mlflow_parent_overview.png", args.wait, CLOSE_JS + SHOW_MORE_JS),
            (overview, out / "mlflow_datasets.png", args.wait, CLOSE_JS + DATASETS_JS)] if args.overview else [
            (f"{base}/runs", out / "mlflow_sweep_runs.png", args.wait, EXPAND_JS % parent.info.run_id),
            (compare, out / "mlflow_sweep_compare.png", args.wait, None)]
        asyncio.run(drive(port, shots, (1400, 900)))
    finally:
        chrome.terminate()
        chrome.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
