"""The worker half of the GPU check: each config through `worker run --config`
(one process each, as in a sweep and as `worker fidelity` runs them), its
events turned into a measurement record as the orchestrator's collector does
(orchestrator/src/collect.rs `to_record`): framework `burn-<backend>`, `gpu`
the device the worker saw, precision what ran, peaks in GiB unrounded and the
peak's exact bytes.
"""

import glob
import json
import os
import subprocess
import time

import records

GIB = float(1 << 30)
BUDGET_GIB = 60.0  # the group's policy: above it a run is `over_budget`


def read_events(state_dir):
    """(start env, phase ends, result) of the one run under `state_dir`."""
    env, ends, result = None, [], None
    for path in glob.glob(os.path.join(state_dir, "*", "runs", "*", "events.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if e.get("event") == "start":
                    env, ends, result = e.get("env") or {}, [], None
                elif e.get("event") == "phase_end":
                    ends.append(e)
                elif e.get("event") == "result":
                    result = e
    return env, ends, result


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


class WorkerHalf:
    """Runs configs through one worker binary, appending records to OUT."""

    def __init__(self, worker, backend, out, work, table):
        self.worker, self.backend, self.out, self.work, self.table = worker, backend, out, work, table
        self.runs = 0

    def run(self, part, item, timeout, cache_dir=None, tag=""):
        """One config; returns the detail row (also appended to OUT/phases.jsonl)."""
        cfg = item["config"]
        self.runs += 1
        run_dir = os.path.join(self.work, f"{self.runs:03d}-{part}{tag}-{cfg['name']}"[:120])
        os.makedirs(run_dir, exist_ok=True)
        cfg_path = os.path.join(run_dir, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        state = os.path.join(run_dir, "state")
        cmd = [self.worker, "run", "--backend", self.backend, "--config", cfg_path, "--state-dir", state]
        if cache_dir:
            cmd += ["--cache-dir", cache_dir]
        if item.get("memory_limit"):
            cmd += ["--memory-limit", str(item["memory_limit"])]
        start = time.time()
        with open(os.path.join(run_dir, "stderr.txt"), "w") as err:
            try:
                code = subprocess.run(cmd, stdout=err, stderr=err, timeout=max(timeout, 1)).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        wall = time.time() - start
        env, ends, result = read_events(state)
        detail = {"half": "worker", "part": part + tag, "id": item["id"], "exit": code, "wall_s": round(wall, 2)}
        if result is None:
            detail["status"] = "timeout" if code == "timeout" else "no result"
        else:
            detail.update(status=result["status"], phases=result.get("peaks"), message=result.get("message"))
            detail.update(nvml_peak_bytes=result.get("nvml_peak_bytes"), worker_wall_s=result.get("wall_s"))
            detail["kernel_cache"] = (env or {}).get("kernel_cache")
            detail["step0_s"] = sum(e.get("seconds", 0) for e in ends if e.get("phase") in ("fwd", "bwd", "step"))
            rec = to_record(cfg, env or {}, result, self.table)
            if rec is not None and not tag.endswith("warm"):
                with open(os.path.join(self.out, "worker.jsonl"), "a") as f:
                    f.write(json.dumps(rec) + "\n")
        with open(os.path.join(self.out, "phases.jsonl"), "a") as f:
            f.write(json.dumps(detail) + "\n")
        return detail
