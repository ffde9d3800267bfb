"""bench_train.py --faults: training that outlives its parameter server (doc/faults.md).

On one `dg up` cluster (1 ps + --workers workers, with dg up's supervisor), the MLP of
examples/mlp.json trains --fault-epochs epochs (async, "checkpoint_secs": 0.25, "reinit":
true) --runs times undisturbed and --runs times with the ps killed (SIGKILL) twice, at ~30% and ~70%
of the undisturbed run's time, alternating, so that a change of the load touches both
alike. The supervisor restarts the ps from its data dir; the job waits, goes back to the
ps's last snapshot and runs on.

Printed:
  restart -> next step: per kill, from the moment the new ps process answers its health
      (polled every 5 ms) to the job's next "resumed" event, seen by polling its events
      every 5 ms (target: median under 2 s);
  examples/s with two kills / undisturbed: the job's nominal examples over its wall time,
      medians of each side (target: >= 0.8x);
  test accuracy of each side's runs (target: the faulted median within 0.01).
"""
import json
import os
import signal
import statistics
import time

from dgrun import http
from modes import Cluster

RESUME_TARGET_S = 2.0
SPEED_TARGET = 0.8
ACCURACY_TARGET = 0.01
CHECKPOINT_SECS = 0.25     # the job snapshots its ps this often: a kill re-runs <= 0.25 s


def ps_pid(cl):
    with open(os.path.join(cl.dir, "ps-0.pid")) as f:
        return int(f.read().split()[0])


def health(addr):
    try:
        st, body = http("GET", f"http://{addr}/v1/health", timeout=1)
    except OSError:
        return None
    return json.loads(body) if st == 200 else None


def events(cl, job, frm):
    st, body = http("GET", f"http://{cl.master}/v1/jobs/{job}/events?from={frm}&timeout_ms=1")
    if st != 200:
        return [], frm
    lines = [json.loads(ln) for ln in body.decode().splitlines() if ln.strip()]
    return lines, frm + len(lines)


def run_job(cl, graph, kill_at, timeout_s):
    """Train graph; SIGKILL the ps at each time in kill_at (s after the start). Returns
    (wall s, final status, [restart -> resumed s per kill])."""
    st, reply = http("POST", f"http://{cl.master}/v1/jobs", {"graph": graph})
    if st != 201:
        raise RuntimeError(f"POST /v1/jobs: {st} {reply.decode(errors='replace')}")
    job, t0 = json.loads(reply)["id"], time.monotonic()
    ps = cl.addrs[0]
    pending = list(kill_at)
    delays, seen, frm = [], 0, 0
    up_at = None                    # the restarted ps answered at this time
    epoch = (health(ps) or {}).get("epoch", 0)
    while True:
        now = time.monotonic() - t0
        if pending and now >= pending[0]:
            pending.pop(0)
            os.kill(ps_pid(cl), signal.SIGKILL)
            up_at = None
        if up_at is None and len(delays) < len(kill_at) - len(pending):
            h = health(ps)
            if h and h.get("epoch", 0) > epoch:
                epoch, up_at = h["epoch"], time.monotonic()
        evs, frm = events(cl, job, frm)
        for e in evs:
            if e.get("event") == "resumed" and "ps" in e.get("task", "") and up_at:
                delays.append(time.monotonic() - up_at)
                up_at = None
            if e.get("event") in ("done", "failed", "canceled"):
                seen = 1
        if seen:
            break
        if now > timeout_s:
            http("DELETE", f"http://{cl.master}/v1/jobs/{job}")
            raise RuntimeError(f"job {job} still running after {timeout_s} s; canceled")
        time.sleep(0.005)
    wall = time.monotonic() - t0
    st, reply = http("GET", f"http://{cl.master}/v1/jobs/{job}")
    status = json.loads(reply)
    if status["state"] != "done":
        raise RuntimeError(f"job {job} {status['state']}: {json.dumps(status.get('error'))}")
    return wall, status, delays


def accuracy(status):
    return status["training"]["eval"]["test_accuracy"]


def bench_faults(args):
    with open(args.graph) as f:
        graph = json.load(f)
    tr = graph["training"]
    tr["epochs"] = args.fault_epochs
    tr.pop("steps", None)
    tr["checkpoint_secs"] = CHECKPOINT_SECS
    tr["reinit"] = True        # every run starts from the initial weights
    examples = None
    print(f"bench_train --faults: {os.path.basename(args.graph)}, {args.fault_epochs} epochs, "
          f"{args.workers} workers, checkpoint_secs {CHECKPOINT_SECS}, {args.runs} runs of "
          f"each side; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    # Two kills a run, several runs a minute: more than the supervisor's default 5.
    cl = Cluster(args.dg, args.workers, args.dg_blas_threads, ("--max-restarts", "100"))
    clean, faulted, delays = [], [], []
    try:
        for i in range(args.runs):
            wall, status, _ = run_job(cl, graph, [], args.timeout_s)
            examples = status["training"]["examples"]
            clean.append((wall, accuracy(status)))
            print(f"  undisturbed {i + 1}: {wall:.2f} s, {examples / wall:.0f} examples/s, "
                  f"test accuracy {accuracy(status):.4f}", flush=True)
            kills = [0.3 * wall, 0.7 * wall]
            wall, status, d = run_job(cl, graph, kills, args.timeout_s)
            faulted.append((wall, accuracy(status)))
            delays += d
            print(f"  two ps kills {i + 1}: {wall:.2f} s, {examples / wall:.0f} examples/s, "
                  f"test accuracy {accuracy(status):.4f}, restart -> next step "
                  + ", ".join(f"{x:.3f} s" for x in d), flush=True)
    finally:
        cl.close()
    speed = statistics.median(examples / w for w, _ in faulted) / \
        statistics.median(examples / w for w, _ in clean)
    acc_c = statistics.median(a for _, a in clean)
    acc_f = statistics.median(a for _, a in faulted)
    resume = statistics.median(delays) if delays else float("inf")
    ok = [resume < RESUME_TARGET_S, speed >= SPEED_TARGET, abs(acc_f - acc_c) <= ACCURACY_TARGET]
    print(f"restart -> next step: median {resume:.3f} s of {len(delays)} kills "
          f"(max {max(delays) if delays else float('nan'):.3f}; target < {RESUME_TARGET_S} s) "
          f"{'ok' if ok[0] else 'MISSED'}")
    print(f"examples/s with two ps kills / undisturbed: {speed:.2f}x (target >= "
          f"{SPEED_TARGET}x) {'ok' if ok[1] else 'MISSED'}")
    print(f"test accuracy: undisturbed {acc_c:.4f}, with kills {acc_f:.4f} (target within "
          f"{ACCURACY_TARGET}) {'ok' if ok[2] else 'MISSED'}")
    return 4 if args.strict and not all(ok) else 0
