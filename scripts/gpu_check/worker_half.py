"""The worker half of the GPU check: each config through `worker run --config`
(one process each, as in a sweep and as `worker fidelity` runs them), its
events turned into a measurement record as the orchestrator's collector does
(orchestrator/src/collect.rs `to_record`): framework `burn-<backend>`, `gpu`
the device the worker saw, precision what ran, peaks in GiB unrounded and the
peak's exact bytes. Also `worker warm` (filling a kernel cache) and one task
of several configs (`worker run --manifest`, `configs_per_task`), timed.
"""

import glob
import json
import os
import subprocess
import time

import records

GIB = float(1 << 30)
BUDGET_GIB = 60.0  # the group's policy: above it a run is `over_budget`


def read_runs(state_dir):
    """{config name: (start env, phase ends, result)} of the runs under `state_dir`
    (a config started again keeps its last attempt)."""
    runs = {}
    for path in glob.glob(os.path.join(state_dir, "*", "runs", "*", "events.jsonl")):
        name, env, ends, result = None, None, [], None
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if e.get("event") == "start":
                    name, env, ends, result = e.get("config"), e.get("env") or {}, [], None
                elif e.get("event") == "phase_end":
                    ends.append(e)
                elif e.get("event") == "result":
                    result = e
        if name is not None:
            runs[name] = (env, ends, result)
    return runs


def to_record(cfg, env, result, table):
    """A finished run as a measurement record; None for `failed`/`cancelled`."""
    status = result["status"]
    if status not in ("ok", "oom"):
        return None
    peak_bytes = result["peak_bytes"]
    peak = peak_bytes / GIB
    oom = status == "oom"
    precision = cfg["precision"]
    if env.get("requested_dtype") and env.get("dtype") == "f32":
        precision = "fp32"  # what ran: the device had no half type
    r = {
        "id": f"{table}/{cfg['name']}",
        "table": table,
        "framework": f"burn-{env.get('backend', 'unknown')}",
        "gpu": env.get("device", "unknown"),
    }
    r.update(records.config_fields(cfg, precision))
    r["params_m"] = round(result["params"] / 1e5) / 10
    if not oom:
        r["peak_gb"], r["peak_bytes"] = peak, peak_bytes
    for ph in ("model", "fwd", "bwd"):
        if result.get("peaks", {}).get(ph) is not None:
            r[ph + "_gb"] = result["peaks"][ph] / GIB
    if oom:
        r["oom_reported_gb"] = peak
    r["status"] = "oom" if oom else ("over_budget" if peak > BUDGET_GIB else "ok")
    if env.get("device_memory_bytes"):
        r["device_memory_gb"] = env["device_memory_bytes"] / GIB
    if env.get("memory_limit_bytes"):
        r["memory_limit_gb"] = env["memory_limit_bytes"] / GIB
    r["config_name"] = cfg["name"]
    note = f"{env.get('backend')} on {env.get('host')}, dtype {env.get('dtype')}"
    if env.get("driver"):
        note += f", driver {env['driver']}"
    if oom and result.get("phase"):
        note += f", oom in {result['phase']}"
    r["note"] = note
    return r


def _detail(part, item, code, wall, run):
    """One run's row of OUT/phases.jsonl."""
    d = {"half": "worker", "part": part, "id": item["id"], "exit": code, "wall_s": round(wall, 2)}
    env, ends, result = run or (None, [], None)
    d["phase_s"] = {e["phase"]: round(e.get("seconds", 0), 3) for e in ends}
    if result is None:
        d["status"] = "timeout" if code == "timeout" else "no result"
        d["phases_ended"] = [e["phase"] for e in ends]
        return d
    d.update(status=result["status"], phases=result.get("peaks"), message=result.get("message"))
    d.update(nvml_peak_bytes=result.get("nvml_peak_bytes"), worker_wall_s=result.get("wall_s"))
    d["peak_bytes"] = result.get("peak_bytes")
    d["kernel_cache"] = (env or {}).get("kernel_cache")
    return d


class WorkerHalf:
    """Runs configs through one worker binary, appending records to OUT."""

    def __init__(self, worker, backend, out, work, table):
        self.worker, self.backend, self.out, self.work, self.table = worker, backend, out, work, table
        self.runs, self.recorded = 0, set()

    def _dir(self, label):
        self.runs += 1
        d = os.path.join(self.work, f"{self.runs:03d}-{label}"[:120])
        os.makedirs(d, exist_ok=True)
        return d

    def _exec(self, cmd, run_dir, timeout):
        """Run `cmd`; past `timeout` it is sent SIGTERM (the worker then records
        the run `cancelled` in the phase it reached), SIGKILL 10 s later."""
        start = time.time()
        with open(os.path.join(run_dir, "output.txt"), "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=log)
            try:
                code = p.wait(timeout=max(timeout, 1))
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                code = "timeout"
        return code, time.time() - start

    def _append(self, name, row):
        with open(os.path.join(self.out, name), "a") as f:
            f.write(json.dumps(row) + "\n")

    def _keep(self, item, run, record):
        """The record of `item`'s run, once per config (the first run of it)."""
        cfg = item["config"]
        if not record or run is None or run[2] is None or cfg["name"] in self.recorded:
            return
        rec = to_record(cfg, run[0] or {}, run[2], self.table)
        if rec is not None:
            self.recorded.add(cfg["name"])
            self._append("worker.jsonl", rec)

    def _cmd(self, state, cache_dir, memory_limit, attention):
        cmd = [self.worker, "run", "--backend", self.backend, "--state-dir", state]
        if cache_dir:
            cmd += ["--cache-dir", cache_dir]
        if memory_limit:
            cmd += ["--memory-limit", str(memory_limit)]
        if attention:
            cmd += ["--attention", attention]
        return cmd

    def run(self, part, item, timeout, cache_dir=None, attention=None, record=True):
        """One config in a process of its own; returns its row (also in OUT/phases.jsonl)."""
        cfg = item["config"]
        run_dir = self._dir(f"{part}-{cfg['name']}")
        cfg_path = os.path.join(run_dir, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        state = os.path.join(run_dir, "state")
        cmd = self._cmd(state, cache_dir, item.get("memory_limit"), attention) + ["--config", cfg_path]
        code, wall = self._exec(cmd, run_dir, timeout)
        run = read_runs(state).get(cfg["name"])
        self._keep(item, run, record)
        detail = _detail(part, item, code, wall, run)
        if attention:
            detail["attention"] = attention
        self._append("phases.jsonl", detail)
        return detail

    def task(self, part, items, timeout, cache_dir=None):
        """The configs of `items` as one array task (`configs_per_task`: all of
        them), as a sweep's job runs them; returns (task row, one row per config)."""
        run_dir = self._dir(f"{part}-task{len(items)}")
        manifest = {
            "experiment": "gpu-check",
            "task_offset": 0,
            "configs_per_task": len(items),
            "configs": [it["config"] for it in items],
        }
        path = os.path.join(run_dir, "manifest.json")
        with open(path, "w") as f:
            json.dump(manifest, f)
        state = os.path.join(run_dir, "state")
        cmd = self._cmd(state, cache_dir, None, None) + ["--manifest", path, "--task-id", "0"]
        code, wall = self._exec(cmd, run_dir, timeout)
        runs = read_runs(state)
        rows = [_detail(part, it, code, wall, runs.get(it["config"]["name"])) for it in items]
        for row in rows:
            row["wall_s"] = None  # the task's wall is the task row's
            self._append("phases.jsonl", row)
        task = {"half": "worker", "part": part, "id": f"task of {len(items)}", "exit": code, "wall_s": round(wall, 2)}
        self._append("phases.jsonl", task)
        return task, rows

    def warm(self, part, cache_dir, timeout):
        """`worker warm --cache-dir`: the kernel cache a node fills before its sweep."""
        run_dir = self._dir(f"{part}-worker-warm")
        cmd = [self.worker, "warm", "--backend", self.backend, "--cache-dir", cache_dir,
               "--state-dir", os.path.join(run_dir, "state")]
        code, wall = self._exec(cmd, run_dir, timeout)
        with open(os.path.join(run_dir, "output.txt")) as f:
            lines = [l.rstrip() for l in f if l.strip()][-12:]
        row = {"half": "worker", "part": part, "id": "worker warm", "exit": code, "wall_s": round(wall, 2), "output": lines}
        self._append("phases.jsonl", row)
        return row
