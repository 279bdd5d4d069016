#!/usr/bin/env python3
"""Validates rendered manifests against real schemas, strictly (unknown fields fail).

Kubernetes kinds: kubernetes-validate --strict, for the Kubernetes version keyward supports.
cert-manager and Prometheus Operator kinds: their CRD schemas, as the cloudcoil models generated
from them, with unknown fields forbidden. A kind with no schema fails: nothing is skipped.

Usage: kubectl kustomize deploy/overlays/cert-manager | python3 deploy/validate.py -
"""
import inspect
import sys

import kubernetes_validate
import pydantic
import yaml
from cloudcoil.models.cert_manager import v1 as cert_manager_v1
from cloudcoil.models.prometheus_operator import v1 as prometheus_operator_v1

KUBERNETES_VERSION = "1.32.0"


def strict_models(module):
    """The module's pydantic models, with extra fields forbidden (the CRDs' strictness)."""
    models = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj.__module__ == module.__name__
    ]
    for model in models:
        model.model_config["extra"] = "forbid"
    for model in models:
        model.model_rebuild(force=True)
    return {model.__name__: model for model in models}


CERT_MANAGER = strict_models(cert_manager_v1)
PROMETHEUS_OPERATOR = strict_models(prometheus_operator_v1)
CUSTOM = {
    **{("cert-manager.io/v1", kind): CERT_MANAGER[kind] for kind in ("Certificate", "Issuer", "ClusterIssuer")},
    **{
        ("monitoring.coreos.com/v1", kind): PROMETHEUS_OPERATOR[kind]
        for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    },
}


def validate(doc):
    """Returns None when valid, else the reason."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM:
        try:
            CUSTOM[key].model_validate(doc)
        except pydantic.ValidationError as e:
            return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        return None
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return f"no schema for {key[0]} {key[1]}; add one to deploy/validate.py"
    except kubernetes_validate.ValidationError as e:
        where = ".".join(str(p) for p in e.path) or "(root)"
        return f"{where}: {e.message}"
    return None


def main(argv):
    stream = sys.stdin if len(argv) < 2 or argv[1] == "-" else open(argv[1], encoding="utf-8")
    docs = [d for d in yaml.safe_load_all(stream) if d]
    failed = 0
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        reason = validate(doc)
        if reason:
            failed += 1
            print(f"FAIL {name}: {reason}")
        else:
            print(f"ok   {name}")
    print(f"{len(docs) - failed} valid, {failed} invalid")
    return 1 if failed or not docs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
