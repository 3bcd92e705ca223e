#!/usr/bin/env python3
"""validate_mpijob.py - checks MPIJob manifests against hpdl's description of
the MPI operator's v2beta1 API (tests/launch/mpijob_api.py), the way an API
server with strict field validation (kubectl's default since 1.27) would:

- every field in the description's table: its type, its allowed values, the
  required ones present; an unknown field is refused (a server would refuse
  or silently drop it: a typo such as `slotPerWorker` would vanish), int32
  and int64 are bounded, and resource quantities must be well formed;
- what the API server checks of any object: metadata.name a DNS-1123
  subdomain, metadata.namespace a DNS-1123 label;
- hpdl's own expectation of an MPIJob: a Launcher with exactly one replica.

  validate_mpijob.py FILE...      exit 0 when all are valid, 1 naming each fault
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpijob_api as api  # noqa: E402

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
CONTAINERS = {"object", "map", "list"}


def load_validator():
    """The table, indexed by parent path; checks that it is well formed."""
    children = {}
    for path, (kind, *flags) in api.FIELDS.items():
        assert kind in CONTAINERS | {"open", "string", "bool", "int32", "int64", "quantity"}, path
        if path:
            parent, _, name = path.rpartition(".")
            assert api.FIELDS[parent][0] == {"*": "map", "[]": "list"}.get(name, "object"), path
            children.setdefault(parent, {})[name] = path
    return children


def check(value, path, where, children, out):
    kind, *flags = api.FIELDS[path]
    allowed = next((f for f in flags if isinstance(f, tuple)), None)
    at = where or "(top)"
    if kind in api.INT_RANGE:
        lo, hi = api.INT_RANGE[kind]
        if not isinstance(value, int) or isinstance(value, bool):
            out.append(f"{at}: {value!r} is not an integer ({kind})")
        elif not lo <= value <= hi:
            out.append(f"{at}: {value} is outside {kind}'s range [{lo}, {hi}]")
        return
    if kind == "quantity":
        if isinstance(value, bool) or not isinstance(value, (int, str)) or \
                isinstance(value, str) and not api.QUANTITY.fullmatch(value):
            out.append(f"{at}: {value!r} is not a Kubernetes quantity (such as 4, \"500m\", \"16Gi\")")
        return
    want = {"string": str, "bool": bool, "list": list}.get(kind, dict)
    if not isinstance(value, want):
        out.append(f"{at}: {value!r} is not {'an' if kind == 'object' else 'a'} {kind}")
        return
    if kind == "string":
        if allowed and value not in allowed:
            out.append(f"{at}: {value!r} is not one of {', '.join(allowed)}")
    elif kind == "list":
        for i, item in enumerate(value):
            check(item, path + ".[]", f"{where}.{i}", children, out)
    elif kind == "map":
        for key, item in value.items():
            if not isinstance(key, str):
                out.append(f"{at}: the key {key!r} is not a string")
            elif allowed and key not in allowed:
                out.append(f"{at}: the key {key!r} is not one of {', '.join(allowed)}")
            else:
                check(item, path + ".*", f"{where}.{key}", children, out)
    elif kind == "object":
        known = children.get(path, {})
        for key, item in value.items():
            if key in known:
                check(item, known[key], f"{where}.{key}" if where else key, children, out)
            else:
                out.append(f"{at}: unknown field {key!r}")
        for key, sub in known.items():
            if api.REQUIRED in api.FIELDS[sub][1:] and key not in value:
                out.append(f"{at}: the required field {key!r} is missing")


def problems(doc, children=None):
    children = children or load_validator()
    out = []
    check(doc, "", "", children, out)
    if not isinstance(doc, dict):
        return out
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or len(name) > 253 or not DNS1123_SUBDOMAIN.fullmatch(name):
        out.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    ns = meta.get("namespace")
    if ns is not None and (not isinstance(ns, str) or len(ns) > 63 or not DNS1123_LABEL.fullmatch(ns)):
        out.append(f"metadata.namespace: {ns!r} is not a DNS-1123 label")
    specs = doc["spec"].get("mpiReplicaSpecs") if isinstance(doc.get("spec"), dict) else None
    if isinstance(specs, dict):
        launcher = specs.get("Launcher")
        if not isinstance(launcher, dict):
            out.append("spec.mpiReplicaSpecs.Launcher: missing")
        elif launcher.get("replicas", 1) != 1:
            out.append("spec.mpiReplicaSpecs.Launcher.replicas: must be 1")
    return out


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    import yaml
    children = load_validator()
    bad = 0
    for path in argv:
        with open(path) as f:
            try:
                doc = yaml.safe_load(f)
            except yaml.YAMLError as e:
                print(f"{path}: not YAML: {e}")
                bad += 1
                continue
        found = problems(doc, children)
        for p in found:
            print(f"{path}: {p}")
        if found:
            bad += 1
        else:
            print(f"{path}: a valid MPIJob")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
