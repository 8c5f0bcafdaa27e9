"""`deploy/kubernetes/`: valid for a current Kubernetes (kubernetes-validate's newest schemas,
offline, strict: unknown fields are errors), and consistent with the service it deploys."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from cubicle.server.settings import Settings

pytestmark = pytest.mark.fast

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES = kubernetes_validate.utils.latest_version()


def documents() -> list[dict]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def of_kind(kind: str) -> list[dict]:
    return [doc for doc in documents() if doc["kind"] == kind]


def ray_pod_templates(cluster: dict) -> list[dict]:
    spec = cluster["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


def test_the_schemas_are_a_current_kubernetes():
    assert Version(KUBERNETES) >= Version("1.33")


@pytest.mark.parametrize("doc", [d for d in documents() if d["kind"] != "RayCluster"], ids=str)
def test_each_kubernetes_object_is_valid(doc):
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_every_ray_pod_is_a_valid_pod_template():
    (cluster,) = of_kind("RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1"
    for template in ray_pod_templates(cluster):
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": template["spec"]["containers"][0]["name"]},
            "template": template,
        }
        kubernetes_validate.validate(wrapped, KUBERNETES, strict=True)


def test_the_validation_catches_a_broken_manifest():
    (deployment,) = of_kind("Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["environment"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_the_service_points_at_the_cluster_kuberay_makes_with_settings_that_exist():
    (cluster,) = of_kind("RayCluster")
    (deployment,) = of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    fields = set(Settings.model_fields)
    for name in env:  # a misspelt CUBICLE_* variable would be ignored in silence
        assert name.removeprefix("CUBICLE_").lower() in fields, name
    assert env["CUBICLE_RUNTIME"] == "ray"
    address = urlsplit(f"//{env['CUBICLE_RAY_ADDRESS']}")
    assert address.hostname == f"{cluster['metadata']['name']}-head-svc"
    assert address.port == 6379
    images = {c["image"] for t in ray_pod_templates(cluster) for c in t["spec"]["containers"]}
    assert images == {container["image"]}  # the same Cubicle and Ray on every side

    resource = Settings().ray_resource
    for group in cluster["spec"]["workerGroupSpecs"]:
        offered = json.loads(json.loads(group["rayStartParams"]["resources"]))
        assert offered[resource] >= 1
        assert group["template"]["spec"]["containers"][0]["securityContext"]["privileged"]
