#!/usr/bin/python3
"""The deployment files, checked and then run for real under podman.

Always (no podman needed):
  1. deploy/compose: compose.yaml parses; every onebit container's command line is accepted
     by its binary (the same flags plus --check, with the job config of the bind mount);
     Prometheus scrapes every onebit service on 9100; Grafana's mounts exist and match
     the provisioning files (deploy/grafana), when those are in the tree.
  2. deploy/k8s: `kubectl kustomize` builds both overlays and the JobSet; every container's
     command line (with $(VAR) filled in as Kubernetes would) is accepted by its binary with
     the job config of its ConfigMap; probes on /healthz and /readyz, non-root, read-only
     root; nvidia.com/gpu and the GPU image on the GPU overlay's workers; the JobSet's
     failure rules (exit 78 and 2 fail it, 75 restarts a member) and success policy.
Then, as root with podman (runc, cgroupfs: deploy/images/containers.conf):
  3. deploy/images/build.sh with the binaries of this build (cached base and layers).
  4. the compose project with podman-compose (without Grafana unless its image is here:
     there is no registry to pull it from): the job passes the switch, a worker metric is
     read through the project's Prometheus (HTTP API), every member's healthcheck passes,
     SIGTERM stops every member with exit 0, the project is removed.
  5. the cpu overlay with `podman kube play`: the coordinator Deployment, the PVC and the
     ConfigMap as they are; the StatefulSet and the indexed Job (kinds podman 4.3 does not
     play) converted to the Pods Kubernetes would make of them; the job passes the switch;
     SIGTERM stops every pod's container with exit 0.
  6. PyTorch workers (deploy/pytorch, the onebit-pytorch image with the wheel of this build):
     examples/gpt as two ranks of the same script, under podman-compose and as the indexed
     Job's pods under `podman kube play`; both ranks train past the freeze to the last step
     and exit 0. The JobSet variant is checked as a file.
A part that cannot run says exactly why it skips. Parts 3-5 run one test at a time on a
machine (a lock file), since they use fixed names.
"""
import contextlib
import copy
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import yaml

FAILURES = []
SKIPS = []
PASSES = 0


def log(msg):
    print(msg, flush=True)


def check(cond, what):
    global PASSES
    if cond:
        PASSES += 1
        log(f"ok: {what}")
    else:
        FAILURES.append(what)
        log(f"FAIL: {what}")
    return cond


def skip(what, why):
    SKIPS.append(what)
    log(f"SKIP: {what}: {why}")


# ---- where things are ----
RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "onebit"))
if not os.path.isdir(os.path.join(RUNFILES, "deploy")):
    RUNFILES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The source tree (runfiles are symlinks into it): compose resolves ../grafana from here.
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(os.path.join(RUNFILES, "deploy/compose/compose.yaml")))))
COMPOSE_DIR = os.path.join(SOURCE, "deploy/compose")
K8S_DIR = os.path.join(SOURCE, "deploy/k8s")
PYTORCH_DIR = os.path.join(SOURCE, "deploy/pytorch")
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
BINARIES = {
    "onebit-coordinator": "coordinator/onebit-coordinator",
    "onebit-server": "server/onebit-server",
    "onebit-worker": "worker/onebit-worker",
    "onebitctl": "tools/onebitctl",
}
ENV = dict(os.environ)
ENV["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENV["CONTAINERS_CONF"] = os.path.join(SOURCE, "deploy/images/containers.conf")
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]


def run(argv, timeout=300, check_rc=False, quiet=False, **kw):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=ENV, **kw)
    if check_rc and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    if not quiet and p.returncode != 0:
        log(f"  ({' '.join(argv[:6])}... exited {p.returncode}: {p.stdout.strip()[-800:]})")
    return p


def accepted(command, config_text, env_values, what):
    """Runs the binary of `command` with its flags + --check; the config in a temp file."""
    binary = command[0]
    if binary not in BINARIES:
        return check(False, f"{what}: unknown command {binary}")
    path = os.path.join(TMP, f"config-{abs(hash(what))}.json")
    with open(path, "w") as f:
        f.write(config_text)
    args = []
    for a in command[1:]:
        a = re.sub(r"\$\((\w+)\)", lambda m: env_values.get(m.group(1), m.group(0)), a)
        check("$(" not in a, f"{what}: every $(VAR) of '{a}' is defined")
        args.append(re.sub(r"^--config=.*", f"--config={path}", a))
    p = run([os.path.join(RUNFILES, BINARIES[binary])] + args + ["--check"], timeout=60)
    return check(p.returncode == 0 and "OK" in p.stdout,
                 f"{what}: {binary} accepts {' '.join(command[1:])}")


# ---- 1. compose ----
def compose_services():
    with open(os.path.join(COMPOSE_DIR, "compose.yaml")) as f:
        return yaml.safe_load(f)["services"]


def check_compose_files():
    services = compose_services()
    members = {n: s for n, s in services.items()
               if str(s.get("command", [""])[0]).startswith("onebit-")}
    check(len(members) == 7, f"compose: coordinator, 2 shards, 4 workers ({sorted(members)})")
    with open(os.path.join(COMPOSE_DIR, "job.json")) as f:
        job = f.read()
    for name, s in members.items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in s["volumes"]}
        check(mounts.get("/etc/onebit/job.json") == "./job.json", f"compose {name}: job.json mounted")
        check(mounts.get("/checkpoints") == "checkpoints", f"compose {name}: checkpoints volume")
        check(s.get("restart") == "on-failure", f"compose {name}: restart on-failure (exit 75)")
        check("/healthz" in " ".join(s["healthcheck"]["test"]), f"compose {name}: healthcheck on /healthz")
        accepted(s["command"], job, {}, f"compose {name}")
    with open(os.path.join(COMPOSE_DIR, "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    targets = {t for sc in prom["scrape_configs"] for st in sc["static_configs"] for t in st["targets"]}
    check(targets == {f"{n}:9100" for n in members}, f"prometheus.yml scrapes every member ({sorted(targets)})")
    cfg = json.loads(job)
    check(cfg["onebit"]["checkpoint"]["dir"] == "/checkpoints", "compose job: checkpoints in the volume")
    # Grafana: the mounts and the provisioning files agree (deploy/grafana, branch dash).
    grafana = services["grafana"]
    mounts = {v.split(":")[1]: os.path.normpath(os.path.join(COMPOSE_DIR, v.split(":")[0]))
              for v in grafana["volumes"]}
    prov = mounts.get("/etc/grafana/provisioning")
    if prov is None or not os.path.isdir(os.path.join(prov, "datasources")):
        skip("compose grafana provisioning files", f"{prov} is not in this tree (deploy/grafana comes from the dashboard's branch)")
        return
    ds = [yaml.safe_load(open(os.path.join(prov, "datasources", f)))
          for f in os.listdir(os.path.join(prov, "datasources")) if f.endswith((".yaml", ".yml"))]
    urls = [d["url"] for doc in ds for d in doc["datasources"]]
    check("http://prometheus:9090" in urls, f"grafana datasource is the compose Prometheus ({urls})")
    providers = [yaml.safe_load(open(os.path.join(prov, "dashboards", f)))
                 for f in os.listdir(os.path.join(prov, "dashboards")) if f.endswith((".yaml", ".yml"))]
    paths = [p["options"]["path"] for doc in providers for p in doc["providers"]]
    for path in paths:
        check(path in mounts and os.path.isdir(mounts[path]) and
              any(f.endswith(".json") for f in os.listdir(mounts[path])),
              f"grafana dashboards path {path} is mounted and holds the dashboard")


# ---- 2. kustomize ----
def kustomize(overlay):
    p = run(["kubectl", "kustomize", os.path.join(K8S_DIR, "overlays", overlay)], timeout=120)
    check(p.returncode == 0, f"kubectl kustomize overlays/{overlay} builds")
    return list(yaml.safe_load_all(p.stdout)) if p.returncode == 0 else []


def pod_spec(doc):
    return doc["spec"]["template"]["spec"] if doc["kind"] in ("Deployment", "StatefulSet", "Job") else None


def check_pod(name, template, cm, config, gpu_expected=False, index="3"):
    """A pod template's security, mounts, probes, scrape annotations and command lines
    ($(JOB_COMPLETION_INDEX) as `index`)."""
    spec = template["spec"]
    sc = spec.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, f"{name}: runs as non-root")
    check(any(v.get("configMap", {}).get("name") == cm["metadata"]["name"] for v in spec["volumes"]),
          f"{name}: mounts the job ConfigMap")
    check(any("persistentVolumeClaim" in v for v in spec["volumes"]), f"{name}: checkpoints on the PVC")
    ann = template["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == "9100",
          f"{name}: Prometheus scrape annotations")
    for c in spec["containers"]:
        check(c["securityContext"].get("readOnlyRootFilesystem") is True, f"{name}: read-only root")
        check(c["livenessProbe"]["httpGet"]["path"] == "/healthz" and
              c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{name}: probes on /healthz, /readyz")
        values = {"SHARD_INDEX": "1", "POD_IP": "10.0.0.5", "JOB_COMPLETION_INDEX": index, "POD_NAME": "p"}
        accepted(c["command"] + c["args"], config, values, name)
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if gpu_expected:
            check(gpus == 1 and "onebit-gpu" in c["image"], f"{name}: one nvidia.com/gpu, the GPU image")
        else:
            check(gpus is None, f"{name}: no GPU asked")


def check_jobset_files():
    """deploy/k8s/jobset: the base's ConfigMap, PVC and coordinator Service plus one JobSet
    whose replicated Jobs run the members; exit 78 and 2 fail the set (podFailurePolicy
    FailJob, then failurePolicy FailJobSet), 75 restarts a member without counting, and the
    set succeeds when every worker has."""
    if shutil.which("kubectl", path=ENV["PATH"]) is None:
        skip("deploy/k8s/jobset", "kubectl is not installed (its kustomize builds the JobSet)")
        return
    p = run(["kubectl", "kustomize", os.path.join(K8S_DIR, "jobset")], timeout=120)
    if not check(p.returncode == 0, "kubectl kustomize deploy/k8s/jobset builds"):
        log(p.stderr)
        return
    objs = list(yaml.safe_load_all(p.stdout))
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
    cms = [o for o in objs if o["kind"] == "ConfigMap"]
    check(sorted(o["kind"] for o in objs) == ["ConfigMap", "JobSet", "PersistentVolumeClaim", "Service"],
          f"jobset: a JobSet beside the base's ConfigMap, PVC and coordinator Service only ({kinds})")
    jobsets = [o for o in objs if o["kind"] == "JobSet"]
    if not cms or not jobsets:
        return
    config = cms[0]["data"]["job.json"]
    cfg = json.loads(config)
    js = jobsets[0]
    check(js["apiVersion"] == "jobset.x-k8s.io/v1alpha2", "jobset: jobset.x-k8s.io/v1alpha2")
    spec = js["spec"]
    jobs = {r["name"]: r for r in spec["replicatedJobs"]}
    check(sorted(jobs) == ["coordinator", "server", "worker"], f"jobset: replicated Jobs {sorted(jobs)}")
    check(spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker"]},
          "jobset: done when every worker is")
    check(any(r["action"] == "FailJobSet" and r.get("onJobFailureReasons") == ["PodFailurePolicy"]
              for r in spec["failurePolicy"]["rules"]),
          "jobset: a Job failed by its podFailurePolicy fails the set")
    coordinator = f"{js['metadata']['name']}-coordinator-0-0.{spec['network']['subdomain']}:7000"
    completions = {n: r["template"]["spec"].get("completions") for n, r in jobs.items()}
    check(completions == {"coordinator": 1, "server": cfg["onebit"]["exchange"]["servers"],
                          "worker": cfg["onebit"]["workers"]},
          f"jobset: {completions} match the job config's servers and workers")
    for name, r in jobs.items():
        job = r["template"]["spec"]
        pod = job["template"]
        what = f"jobset {name}"
        check(r["replicas"] == 1 and pod["spec"]["restartPolicy"] == "Never",
              f"{what}: one Job, failed pods replaced (restartPolicy Never, as podFailurePolicy needs)")
        container = pod["spec"]["containers"][0]["name"]
        codes = {}
        for rule in job["podFailurePolicy"]["rules"]:
            on = rule.get("onExitCodes")
            if on is not None:
                check(on["containerName"] == container and on["operator"] == "In",
                      f"{what}: exit-code rule for its container {container}")
                for code in on["values"]:
                    codes[code] = rule["action"]
        check(codes == {75: "Ignore", 2: "FailJob", 78: "FailJob"},
              f"{what}: 78 and 2 fail the Job, 75 restarts without counting ({codes})")
        # The last index of each Job (a shard index must be below exchange.servers).
        check_pod(what, pod, cms[0], config, index=str(completions[name] - 1))
        image = pod["spec"]["containers"][0]["image"]
        check(image == "localhost/onebit:latest", f"{what}: the base's image ({image})")
        args = pod["spec"]["containers"][0]["args"]
        if name != "coordinator":
            check(f"--coordinator={coordinator}" in args, f"{what}: finds the coordinator at {coordinator}")
    service = [o for o in objs if o["kind"] == "Service"][0]
    labels = jobs["coordinator"]["template"]["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
          "jobset: the coordinator Service selects the coordinator's pod")


def check_k8s_files():
    if shutil.which("kubectl", path=ENV["PATH"]) is None:
        skip("deploy/k8s", "kubectl is not installed (its kustomize builds the overlays)")
        return None
    docs = {}
    for overlay in ("cpu", "gpu"):
        objs = kustomize(overlay)
        docs[overlay] = objs
        kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs)
        want = {"Deployment", "StatefulSet", "Job", "ConfigMap", "PersistentVolumeClaim", "Service"}
        check(want <= {o["kind"] for o in objs}, f"{overlay}: {kinds}")
        cm = [o for o in objs if o["kind"] == "ConfigMap"]
        config = cm[0]["data"]["job.json"] if cm else "{}"
        cfg = json.loads(config)
        for o in objs:
            spec = pod_spec(o)
            if spec is None:
                continue
            check_pod(f"{overlay} {o['kind']}/{o['metadata']['name']}", o["spec"]["template"],
                      cm[0], config, gpu_expected=o["kind"] == "Job" and overlay == "gpu")
        if overlay == "gpu":
            check(cfg["onebit"]["device"] == "cuda", "gpu overlay: job config with device cuda")
        replicas = {o["kind"]: o["spec"].get("replicas", o["spec"].get("completions")) for o in objs
                    if o["kind"] in ("StatefulSet", "Job")}
        check(replicas.get("StatefulSet") == cfg["onebit"]["exchange"]["servers"] and
              replicas.get("Job") == cfg["onebit"]["workers"],
              f"{overlay}: {replicas} match the job config's servers and workers")
    return docs


# ---- podman helpers ----
def podman(*args, timeout=300, **kw):
    return run(PODMAN + list(args), timeout=timeout, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception as e:  # refused, timeout, HTTP error
        return 0, str(e)


def wait_for(what, fn, timeout):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(2)
    return last


def live_prerequisites():
    if os.geteuid() != 0:
        return "not root: podman runs real containers here as root only (deploy/images/containers.conf)"
    for tool in ("podman", "podman-compose", "debootstrap"):
        if shutil.which(tool, path=ENV["PATH"]) is None:
            return f"{tool} is not installed (deploy/install-deps.sh installs it)"
    if os.environ.get("ONEBIT_DEPLOY_TEST_NO_PODMAN"):
        return "ONEBIT_DEPLOY_TEST_NO_PODMAN is set"
    return None


# ---- 3. images ----
def the_wheel():
    wheels = [f for f in os.listdir(os.path.join(RUNFILES, "python"))
              if f.startswith("onebit-") and "manylinux" in f and f.endswith(".whl")]
    return os.path.join(RUNFILES, "python", wheels[0]) if wheels else None


def build_images():
    wheel = the_wheel()
    p = run(["bash", os.path.join(SOURCE, "deploy/images/build.sh"), f"--bin_dir={RUNFILES}"] +
            ([f"--wheel={wheel}"] if wheel else []), timeout=3000)
    log(p.stdout[-2500:])
    return check(p.returncode == 0, "deploy/images/build.sh built and checked the images")


# ---- 4. compose ----
def prometheus_query(port, query):
    status, body = http_get(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(query)}")
    if status != 200:
        return None
    data = json.loads(body)
    return data["data"]["result"] if data.get("status") == "success" else None


def run_compose():
    project = f"onebittest{os.getpid()}"
    compose = os.path.join(COMPOSE_DIR, "compose.yaml")
    prom_port, rest_port = free_port(), free_port()
    ENV.update(ONEBIT_PROMETHEUS_PORT=str(prom_port), ONEBIT_REST_PORT=str(rest_port),
               ONEBIT_GRAFANA_PORT=str(free_port()))
    services = [s for s in compose_services() if s != "grafana"]
    grafana_image = re.sub(r"\$\{ONEBIT_GRAFANA_IMAGE:-(.*)\}", r"\1", compose_services()["grafana"]["image"])
    if podman("image", "exists", grafana_image, quiet=True).returncode == 0:
        services.append("grafana")
    else:
        skip("compose service grafana", f"image {grafana_image} is not here and there is no registry to pull it "
             "from (Grafana is not packaged by Debian 12); its provisioning files are checked above")
    pc = ["podman-compose", "-p", project, "-f", compose]
    try:
        p = run(pc + ["up", "-d"] + services, timeout=600)
        check(p.returncode == 0, f"podman-compose up -d {' '.join(services)}")
        freeze = json.load(open(os.path.join(COMPOSE_DIR, "job.json")))["optimizer"]["params"]["freeze_step"]

        def past_switch():
            r = prometheus_query(prom_port, "min(onebit_worker_step)")
            if r and float(r[0]["value"][1]) > freeze:
                return r
            return None
        r = wait_for("switch", past_switch, 300)
        check(bool(r), f"compose: every worker past the switch (freeze_step {freeze}), "
              f"read through Prometheus: min(onebit_worker_step) = {r[0]['value'][1] if r else None}")
        # One scrape can miss a busy member (a CI run saw worker-3's up = 0 once, every
        # healthcheck passing): wait for a round in which Prometheus reached all 7.
        def every_member_scraped():
            up = prometheus_query(prom_port, "up") or []
            stages = prometheus_query(prom_port, "onebit_worker_stage") or []
            done = (len(up) == 7 and all(u["value"][1] == "1" for u in up) and
                    len(stages) == 4 and all(s["value"][1] == "1" for s in stages))
            return (up, stages) if done else None
        scraped = wait_for("every member scraped", every_member_scraped, 60)
        up, stages = scraped or ((prometheus_query(prom_port, "up") or []),
                                 (prometheus_query(prom_port, "onebit_worker_stage") or []))
        check(len(stages) == 4 and all(s["value"][1] == "1" for s in stages),
              f"compose: onebit_worker_stage of 4 workers through Prometheus: "
              f"{[(s['metric'].get('instance'), s['value'][1]) for s in stages]}")
        check(len(up) == 7 and all(u["value"][1] == "1" for u in up),
              f"compose: Prometheus scraped all 7 members: {[(u['metric']['instance'], u['value'][1]) for u in up]}")
        names = {s: f"{project}_{s}_1" for s in services}
        for s in services:
            if s in ("prometheus", "grafana"):
                continue
            state = podman("inspect", "-f", "{{.State.Status}}", names[s], quiet=True).stdout.strip()
            if state == "running":
                hc = podman("healthcheck", "run", names[s], quiet=True)
                after = podman("inspect", "-f", "{{.State.Status}}", names[s], quiet=True).stdout.strip()
                if hc.returncode != 0:
                    # The job may be ending, and the member with it: it stops serving /healthz
                    # a moment before its container exits (CI runs saw workers end so, one
                    # still "running" just after its failed check). Its exit code is checked
                    # below.
                    deadline = time.monotonic() + 15
                    while after == "running" and time.monotonic() < deadline:
                        time.sleep(0.5)
                        after = podman("inspect", "-f", "{{.State.Status}}", names[s],
                                       quiet=True).stdout.strip()
                if hc.returncode != 0 and after != "running":
                    print(f"compose {s}: ended during its healthcheck ({after})")
                    continue
                check(hc.returncode == 0, f"compose {s}: healthcheck (curl /healthz in the container) passes")
        code, body = http_get(f"http://127.0.0.1:{rest_port}/v1/job")
        check(code == 200 and "step" in body, f"compose: the coordinator's REST mirror on the host port ({code})")
        # SIGTERM in the order that strands the most: the coordinator first, then the shards,
        # then the workers (the processes' own test, StopOrderTest, tries every order; kube
        # play below stops the workers first).
        members = [names[s] for s in services if s not in ("prometheus", "grafana")]
        for group in ("coordinator", "server-", "worker-"):
            podman("stop", "-t", "20", *[m for m in members if f"_{group}" in m], timeout=120)
        codes = {m: podman("inspect", "-f", "{{.State.ExitCode}}", m, quiet=True).stdout.strip() for m in members}
        check(all(c == "0" for c in codes.values()),
              f"compose: every member exited 0 after SIGTERM, coordinator first, then shards, then workers (or at the job's end): {codes}")
        if any(c != "0" for c in codes.values()):
            for m in members:
                log(podman("logs", "--tail", "15", m, quiet=True).stdout)
    finally:
        run(pc + ["down", "-v"], timeout=300, quiet=True)
        podman("network", "rm", "-f", f"{project}_default", quiet=True)
        left = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "-q", quiet=True).stdout.split()
        check(not left, "compose: project removed")


# ---- 5. podman kube play ----
def as_pods(objs, subnet_prefix):
    """The cpu overlay's objects as podman 4.3 plays them: Deployments, PVCs and ConfigMaps
    as they are; each StatefulSet replica and each index of an indexed Job as the Pod
    Kubernetes would make (pod-index label, JOB_COMPLETION_INDEX); Services dropped, the
    coordinator's name pointed at its pod (hostAliases), status.podIP (which podman 4.3
    does not fill in) set to the static address the pod is played with, $(VAR) in command
    and args expanded (by the kubelet on Kubernetes; podman 4.3 leaves them), containerPorts
    left out (podman 4.3 publishes each on the host, so the second pod's 9100 would clash;
    on Kubernetes they publish nothing)."""
    first, rest, ips = [], [], []
    coordinator_ip = f"{subnet_prefix}.10"
    next_ip = [20]
    for o in objs:
        kind = o["kind"]
        if kind in ("ConfigMap", "PersistentVolumeClaim"):
            first.append(o)
        elif kind == "Deployment":
            o = copy.deepcopy(o)
            for c in o["spec"]["template"]["spec"]["containers"]:
                c.pop("ports", None)  # podman 4.3 publishes them on the host (see the docstring)
            first.append(o)
        elif kind in ("StatefulSet", "Job"):
            n = o["spec"].get("replicas", o["spec"].get("completions", 1))
            for i in range(n):
                tmpl = copy.deepcopy(o["spec"]["template"])
                name = f"{o['metadata']['name']}-{i}"
                ip = f"{subnet_prefix}.{next_ip[0]}"
                next_ip[0] += 1
                meta = tmpl["metadata"]
                meta["name"] = name
                meta.setdefault("labels", {})
                if kind == "StatefulSet":
                    meta["labels"]["apps.kubernetes.io/pod-index"] = str(i)
                spec = tmpl["spec"]
                spec["hostAliases"] = [{"ip": coordinator_ip, "hostnames": ["onebit-coordinator"]}]
                if kind == "Job":
                    spec["restartPolicy"] = "OnFailure"
                for c in spec["containers"]:
                    c.pop("ports", None)
                    env = []
                    for e in c.get("env", []):
                        if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                            e = {"name": e["name"], "value": ip}
                        env.append(e)
                    if kind == "Job":
                        env.append({"name": "JOB_COMPLETION_INDEX", "value": str(i)})
                    values = {}
                    for e in env:
                        path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
                        m = re.match(r"metadata\.labels\['(.+)'\]$", path)
                        values[e["name"]] = (e["value"] if "value" in e else
                                             meta["labels"].get(m.group(1), "") if m else
                                             name if path == "metadata.name" else "")
                    # Kubernetes expands $(VAR) in command and args; podman 4.3 does not.
                    expand = lambda a: re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), a)
                    c["command"] = [expand(a) for a in c.get("command", [])]
                    c["args"] = [expand(a) for a in c.get("args", [])]
                    c["env"] = env
                rest.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
                ips.append(ip)
        elif kind == "Service":
            log(f"  kube play: Service/{o['metadata']['name']} dropped (podman has no Services; "
                "the name is pointed at the pod with hostAliases)")
    return first, rest, coordinator_ip, ips


def container_exit_codes(pods):
    codes = {}
    for pod in pods:
        p = podman("pod", "inspect", pod, "--format", "{{range .Containers}}{{.Name}} {{end}}", quiet=True)
        if p.returncode != 0:
            codes[pod] = "missing"
            continue
        for c in p.stdout.split():
            if c.endswith("-infra"):
                continue
            codes[c] = podman("inspect", "-f", "{{.State.ExitCode}} {{.State.Status}}", c, quiet=True).stdout.strip()
    return codes


def run_kube_play(objs):
    net = f"onebitk8s{os.getpid()}"
    octet = 100 + os.getpid() % 100
    prefix = f"10.231.{octet}"
    first, rest, coord_ip, ips = as_pods(objs, prefix)
    f1, f2 = os.path.join(TMP, "kube-first.yaml"), os.path.join(TMP, "kube-pods.yaml")
    fcm = os.path.join(TMP, "kube-configmap.yaml")
    with open(f1, "w") as f:
        yaml.safe_dump_all(first, f)
    with open(fcm, "w") as f:  # the second play reads the same ConfigMap
        yaml.safe_dump_all([o for o in first if o["kind"] == "ConfigMap"], f)
    with open(f2, "w") as f:
        yaml.safe_dump_all(rest, f)
    pods = []
    try:
        p = podman("network", "create", "--subnet", f"{prefix}.0/24", net)
        if not check(p.returncode == 0, f"kube play: network {net} ({prefix}.0/24)"):
            return
        p = podman("kube", "play", "--network", net, "--ip", coord_ip, f1, timeout=300)
        check(p.returncode == 0, "podman kube play: Deployment/onebit-coordinator, PVC, ConfigMap")
        pods.append("onebit-coordinator-pod-0")
        args = ["kube", "play", "--network", net, "--configmap", fcm]
        for ip in ips:
            args += ["--ip", ip]
        p = podman(*args, f2, timeout=600)
        if not check(p.returncode == 0, f"podman kube play: {len(rest)} pods of the StatefulSet and the indexed Job"):
            return
        pods += [d["metadata"]["name"] for d in rest]
        coord = "onebit-coordinator-pod-0-coordinator"
        cfg = json.loads([o for o in first if o["kind"] == "ConfigMap"][0]["data"]["job.json"])
        freeze = cfg["optimizer"]["params"]["freeze_step"]

        def step():
            out = podman("exec", coord, "curl", "-fsS", "http://127.0.0.1:9100/metrics", quiet=True).stdout
            m = re.search(r"^onebit_coordinator_step(?:\{[^}]*\})? (\S+)", out, re.M)
            return float(m.group(1)) if m and float(m.group(1)) > freeze else None
        s = wait_for("kube switch", step, 240)
        check(bool(s), f"kube play: the job passed the switch (coordinator step {s} > freeze_step {freeze})")
        if not s:
            for pod in pods:
                log(podman("pod", "logs", "--tail", "10", pod, quiet=True).stdout)
        ready = podman("exec", coord, "curl", "-fsS", "http://127.0.0.1:9100/readyz", quiet=True)
        check(ready.returncode == 0, "kube play: the coordinator's readiness probe endpoint answers ready")
        user = podman("exec", coord, "id", "-u", quiet=True).stdout.strip()
        ro = podman("exec", coord, "sh", "-c", "touch /x", quiet=True).returncode
        check(user == "10001" and ro != 0, f"kube play: runs as uid {user}, root file system read-only")
        # The workers first, then the shards, then the coordinator (compose stopped the
        # coordinator first).
        workers = [p for p in pods if "worker" in p]
        shards = [p for p in pods if "server" in p]
        for group in (workers, shards, [p for p in pods if p not in workers + shards]):
            podman("pod", "stop", "-t", "20", *group, timeout=180)
        codes = container_exit_codes(pods)
        check(codes and all(c.startswith("0 ") for c in codes.values()),
              f"kube play: every container exited 0 after SIGTERM, workers first, then shards, then the coordinator (or at the job's end): {codes}")
    finally:
        for f in (f2, f1):
            podman("kube", "down", f, timeout=180, quiet=True)
        for v in podman("volume", "ls", "-q", quiet=True).stdout.split():
            if v == "onebit-checkpoints" or v.startswith("onebit-job-"):
                podman("volume", "rm", "-f", v, quiet=True)
        podman("network", "rm", "-f", net, quiet=True)
        left = podman("pod", "ls", "-q", "--filter", "name=onebit-", quiet=True).stdout.split()
        check(not left, "kube play: pods removed")


# ---- 6. PyTorch workers: examples/gpt as two ranks in containers ----
GPT_STEPS, GPT_FREEZE = 60, 30


def check_pytorch_files():
    """The compose file, the Job and the JobSet run the same script with torchrun's
    variables: two ranks, MASTER_ADDR naming rank 0's pod, the completion index as RANK."""
    with open(os.path.join(PYTORCH_DIR, "compose.yaml")) as f:
        compose = yaml.safe_load(f)
    ranks = compose["services"]
    check(sorted(ranks) == ["rank-0", "rank-1"] and
          all(r["environment"]["WORLD_SIZE"] == "2" and r["environment"]["MASTER_ADDR"] == "rank-0"
              for r in ranks.values()) and
          [r["environment"]["RANK"] for r in (ranks["rank-0"], ranks["rank-1"])] == ["0", "1"],
          "deploy/pytorch/compose.yaml: two ranks, RANK 0 and 1, MASTER_ADDR rank-0")
    with open(os.path.join(PYTORCH_DIR, "job.yaml")) as f:
        service, job = list(yaml.safe_load_all(f))
    with open(os.path.join(PYTORCH_DIR, "jobset.yaml")) as f:
        jobset = yaml.safe_load(f)
    rjob = jobset["spec"]["replicatedJobs"][0]
    for what, spec, master in (
            ("job.yaml", job["spec"], f"{job['metadata']['name']}-0.{service['metadata']['name']}"),
            ("jobset.yaml", rjob["template"]["spec"],
             f"{jobset['metadata']['name']}-{rjob['name']}-0-0.{jobset['spec']['network']['subdomain']}")):
        c = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value", e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
               for e in c["env"]}
        check(spec["completionMode"] == "Indexed" and spec["completions"] == 2 and
              env["RANK"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']" and
              env["MASTER_ADDR"] == master and env["WORLD_SIZE"] == "2" and
              c["command"][:2] == ["python3", "/opt/onebit/examples/gpt/train.py"],
              f"deploy/pytorch/{what}: an indexed Job of 2, RANK = the completion index, "
              f"MASTER_ADDR {master}")
    policy = rjob["template"]["spec"]["podFailurePolicy"]["rules"][0]
    check(policy["action"] == "FailJob" and 78 in policy["onExitCodes"]["values"],
          "deploy/pytorch/jobset.yaml: exit 78 fails the Job (and the set)")


def gpt_trained(logs, what):
    """Both ranks' logs: rank 0 passed the freeze and reached the last step."""
    check(f"step {GPT_STEPS}: loss" in logs and "onebit_adam: held-out loss" in logs and
          "compression stage" in logs,
          f"{what}: examples/gpt trained past the freeze (step {GPT_FREEZE}) to step {GPT_STEPS}")
    if f"step {GPT_STEPS}: loss" not in logs:
        log(logs[-4000:])


def run_pytorch_compose():
    project = f"onebitpt{os.getpid()}"
    pc = ["podman-compose", "-p", project, "-f", os.path.join(PYTORCH_DIR, "compose.yaml")]
    names = [f"{project}_rank-{r}_1" for r in (0, 1)]
    try:
        p = run(pc + ["up", "-d"], timeout=600)
        check(p.returncode == 0, "podman-compose up -d (deploy/pytorch: rank-0, rank-1)")

        def ended():
            states = [podman("inspect", "-f", "{{.State.Status}}", n, quiet=True).stdout.strip()
                      for n in names]
            return states if all(s == "exited" for s in states) else None
        wait_for("the PyTorch ranks", ended, 600)
        codes = {n: podman("inspect", "-f", "{{.State.ExitCode}}", n, quiet=True).stdout.strip()
                 for n in names}
        logs = "".join(podman("logs", n, quiet=True).stdout for n in names)
        check(all(c == "0" for c in codes.values()), f"compose (PyTorch): both ranks exited 0: {codes}")
        gpt_trained(logs, "compose (PyTorch)")
    finally:
        run(pc + ["down", "-v"], timeout=300, quiet=True)
        podman("network", "rm", "-f", f"{project}_default", quiet=True)


def run_pytorch_kube_play():
    """deploy/pytorch/job.yaml's indexed Job as the two Pods Kubernetes would make of it
    (podman 4.3 plays no Jobs or Services): the completion index as RANK and as the
    annotation, the headless Service's name of pod 0 pointed at its address."""
    with open(os.path.join(PYTORCH_DIR, "job.yaml")) as f:
        service, job = list(yaml.safe_load_all(f))
    net = f"onebitpt{os.getpid()}"
    prefix = f"10.232.{100 + os.getpid() % 100}"
    ips = [f"{prefix}.{20 + i}" for i in range(job["spec"]["completions"])]
    master = f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    pods = []
    for i, ip in enumerate(ips):
        tmpl = copy.deepcopy(job["spec"]["template"])
        name = f"{job['metadata']['name']}-{i}"
        tmpl.setdefault("metadata", {})["name"] = name
        tmpl["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(i)}
        spec = tmpl["spec"]
        spec.pop("subdomain", None)
        spec["hostAliases"] = [{"ip": ips[0], "hostnames": [master]}]
        for c in spec["containers"]:
            c.pop("ports", None)  # podman 4.3 would publish them on the host
            c.pop("resources", None)
            env = []
            for e in c["env"]:
                path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
                if path == "metadata.annotations['batch.kubernetes.io/job-completion-index']":
                    e = {"name": e["name"], "value": str(i)}
                env.append(e)
            c["env"] = env
        pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": tmpl["metadata"], "spec": spec})
    path = os.path.join(TMP, "pytorch-pods.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(pods, f)
    names = [p["metadata"]["name"] for p in pods]
    try:
        p = podman("network", "create", "--subnet", f"{prefix}.0/24", net)
        if not check(p.returncode == 0, f"kube play (PyTorch): network {net}"):
            return
        args = ["kube", "play", "--network", net]
        for ip in ips:
            args += ["--ip", ip]
        p = podman(*args, path, timeout=600)
        if not check(p.returncode == 0, "podman kube play: the indexed Job's 2 pods (deploy/pytorch/job.yaml)"):
            return

        def ended():
            codes = container_exit_codes([f"{n}" for n in names])
            return codes if codes and all(not v.endswith("running") for v in codes.values()) else None
        codes = wait_for("the PyTorch pods", ended, 600) or container_exit_codes(names)
        logs = "".join(podman("pod", "logs", n, quiet=True).stdout for n in names)
        check(codes and all(c.startswith("0 ") for c in codes.values()),
              f"kube play (PyTorch): both ranks' containers exited 0: {codes}")
        gpt_trained(logs, "kube play (PyTorch)")
    finally:
        podman("kube", "down", path, timeout=180, quiet=True)
        podman("network", "rm", "-f", net, quiet=True)


def main():
    log(f"source tree: {SOURCE}")
    check_compose_files()
    docs = check_k8s_files()
    check_jobset_files()
    check_pytorch_files()
    why = live_prerequisites()
    if why:
        skip("images, compose and kube play under podman", why)
    else:
        lock = open("/tmp/onebit-deploy-test.lock", "w")
        log("waiting for the machine's podman lock (one deploy test at a time)")
        fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.time()
        # For working on one part: ONEBIT_DEPLOY_TEST_PARTS=kube (default: all three).
        parts = os.environ.get("ONEBIT_DEPLOY_TEST_PARTS", "compose,kube,pytorch").split(",")
        if build_images():
            log(f"images: {time.time() - t0:.0f} s")
            t1 = time.time()
            if "compose" in parts:
                run_compose()
                log(f"compose: {time.time() - t1:.0f} s")
            if "kube" not in parts:
                pass
            elif docs:
                t2 = time.time()
                run_kube_play(docs["cpu"])
                log(f"kube play: {time.time() - t2:.0f} s")
            else:
                skip("podman kube play", "no kustomize output (see above)")
            if "pytorch" not in parts:
                pass
            elif the_wheel() is None:
                skip("PyTorch workers in containers", "no wheel in the runfiles (//python:wheel)")
            else:
                t3 = time.time()
                run_pytorch_compose()
                run_pytorch_kube_play()
                log(f"PyTorch workers (compose, kube play): {time.time() - t3:.0f} s")
    log(f"deploy_test: {PASSES} checks passed, {len(FAILURES)} failed, {len(SKIPS)} parts skipped")
    for f in FAILURES:
        log(f"  failed: {f}")
    for s in SKIPS:
        log(f"  skipped: {s}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
