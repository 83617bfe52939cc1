#!/usr/bin/env python3
"""The pods a Kubernetes Indexed Job of deploy/k8s would run, as local processes.

Reads the rendered manifests (deploy/k8s/render.sh) on standard input, checks every field
Loom depends on, and prints one JSON object per pod: the environment and the command line
Kubernetes would give its container, with the volumes' mount paths moved under ROOT
(ROOT/<volume name>) and rank 0's DNS name replaced by 127.0.0.1, the one substitution a
cluster's DNS makes. Any field that is wrong is a line on standard error and exit 1.

Usage: k8s_pods.py ROOT < manifests.yaml
"""
import json
import re
import sys

import yaml


def fail(why):
    print(f"k8s_pods.py: {why}", file=sys.stderr)
    sys.exit(1)


def main():
    root = sys.argv[1]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    services = [d for d in docs if d.get("kind") == "Service"]
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if len(services) != 1 or len(jobs) != 1:
        fail(f"expected one Service and one Job, found {len(services)} and {len(jobs)}")
    svc, job = services[0], jobs[0]
    name, svc_name = job["metadata"]["name"], svc["metadata"]["name"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    if spec.get("completionMode") != "Indexed":
        fail("the Job is not Indexed: its pods would have no completion index (rank)")
    n = spec["completions"]
    if spec.get("parallelism") != n:
        fail(f"parallelism {spec.get('parallelism')} != completions {n}: every rank must run at once")
    if svc["spec"].get("clusterIP") != "None":
        fail("the Service is not headless: pods would get no DNS names of their own")
    if svc["spec"]["selector"] != {"batch.kubernetes.io/job-name": name}:
        fail(f"the Service selects {svc['spec']['selector']}, not the Job's pods")
    if pod.get("subdomain") != svc_name:
        fail(f"the pods' subdomain {pod.get('subdomain')!r} is not the Service {svc_name!r}")
    if pod.get("restartPolicy") != "Never":
        fail("restartPolicy must be Never (a pod failure policy needs it)")
    [c] = pod["containers"]
    env = {}
    for e in c["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = e["valueFrom"]["fieldRef"]["fieldPath"]
    if "LOOM_SECRET" in env:
        fail("LOOM_SECRET is an environment literal: the secret must come from a Secret as a file")
    if env.get("RANK") != "metadata.annotations['batch.kubernetes.io/job-completion-index']":
        fail(f"RANK comes from {env.get('RANK')!r}, not the pod's completion index")
    if env.get("WORLD_SIZE") != str(n):
        fail(f"WORLD_SIZE {env.get('WORLD_SIZE')!r} != completions {n}")
    if env.get("LOCAL_RANK") != "0" or env.get("LOCAL_WORLD_SIZE") != "1":
        fail("one rank per pod: LOCAL_RANK 0, LOCAL_WORLD_SIZE 1")
    if env.get("MASTER_ADDR") != f"{name}-0.{svc_name}":
        fail(f"MASTER_ADDR {env.get('MASTER_ADDR')!r} is not rank 0's pod ({name}-0.{svc_name})")
    ports = [p["port"] for p in svc["spec"]["ports"]]
    if int(env.get("MASTER_PORT", 0)) not in ports:
        fail(f"MASTER_PORT {env.get('MASTER_PORT')} is not a port of the Service {ports}")
    # Volumes: the secret's mode, and where each mount lands.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secret_file = env.get("LOOM_SECRET_FILE", "")
    owner = [p for p in mounts if secret_file.startswith(p + "/")]
    if not owner or "secret" not in volumes[mounts[owner[0]]]:
        fail(f"LOOM_SECRET_FILE {secret_file!r} is not in a Secret volume")
    mode = volumes[mounts[owner[0]]]["secret"].get("defaultMode", 0o644)
    if mode & 0o077:
        fail(f"the secret's defaultMode {mode:o} lets group or others read it: Loom refuses it")
    cmd = c["command"] + c.get("args", [])
    if "--resume-if-saved" not in cmd:
        fail("the command lacks --resume-if-saved: a pod that comes back would not resume")
    code = [a for a in cmd if a.startswith("--checkpoint.sigterm_exit_code=")]
    if not code:
        fail("the command sets no --checkpoint.sigterm_exit_code: a preempted pod would exit 0 and count as done")
    code = int(code[0].split("=", 1)[1])
    ignored = [r for r in spec.get("podFailurePolicy", {}).get("rules", [])
               if r["action"] == "Ignore" and r.get("onExitCodes", {}).get("operator") == "In"
               and code in r["onExitCodes"]["values"] and r["onExitCodes"].get("containerName") == c["name"]]
    if not ignored:
        fail(f"the pod failure policy does not ignore exit code {code}: preemptions would use up backoffLimit")
    if pod.get("terminationGracePeriodSeconds", 30) < 30:
        fail("terminationGracePeriodSeconds under 30 s leaves no time to save")

    def local(path):
        for mount, vol in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if path == mount or path.startswith(mount + "/"):
                return f"{root}/{vol}{path[len(mount):]}"
        return path

    uid = "3f6b2c1e-loom-test"
    for index in range(n):
        pod_env = {}
        for k, v in env.items():
            if v.startswith("metadata.annotations['batch.kubernetes.io/job-completion-index']"):
                v = str(index)
            elif v.startswith("metadata.labels['batch.kubernetes.io/controller-uid']"):
                v = uid
            pod_env[k] = v
        pod_env["JOB_COMPLETION_INDEX"] = str(index)  # what Kubernetes adds itself
        pod_env["MASTER_ADDR"] = "127.0.0.1"
        pod_env["LOOM_SECRET_FILE"] = local(secret_file)
        argv = [re.sub(r"^(--[a-z_.]+=)(/.*)$", lambda m: m.group(1) + local(m.group(2)), a) for a in cmd]
        argv = [local(a) if a.startswith("/") else a for a in argv]
        print(json.dumps({"index": index, "env": pod_env, "argv": argv}))


if __name__ == "__main__":
    main()
