"""Extract the request and response schemas the cloud providers' code uses, from their published API documents.

    python tests/contract/schemas/extract.py ../shared/reference/openapi

writes ``runpod.json``, ``vastai.json`` and ``lambda.json`` next to this file. Only what
a fixture or a sent request is checked against is kept. Responses: per operation and HTTP
status, the body's field names, types, ``required``, ``enum``/``const`` and combinators,
with every ``$ref`` resolved inline; descriptions, examples, formats and value constraints
are dropped. Requests: the query parameters (as one object) and the body, with the value
constraints kept too (patterns, bounds), since a request the server would refuse must fail
a test. Shapes a document lacks are added by hand below, each with a note saying where it
came from. The documents themselves are not part of this project.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# kept keywords: structure and types only
KEEP = {"type", "required", "enum", "const", "additionalProperties", "unevaluatedProperties"}
# requests keep the value constraints as well: the server refuses a request that breaks them
KEEP_REQUEST = KEEP | {"pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
                       "maxLength", "minItems", "maxItems"}
NESTED_ONE = ("items", "additionalProperties", "unevaluatedProperties", "not", "if", "then", "else")
NESTED_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")

# where each document was published, from the reference folder's README
SOURCES = {
    "runpod": {"file": "runpod-v2.json", "published": "runpod/docs api-reference-v2/openapi.json",
               "commit": "a900806e"},
    "vastai": {"file": "vastai.yaml", "published": "vast-ai/docs api-reference/openapi.yaml", "commit": "c624622"},
    "lambda": {"file": "lambda-cloud.json",
               "published": "api-evangelist/lambda-labs openapi/_original/lambda-labs-openapi.json "
                            "(a public mirror of Lambda's spec)", "commit": "911506f"},
}

# (operationId, method, path) the provider modules call
OPERATIONS = {
    "runpod": [("listGpuTypes", "get", "/v2/catalog/gpus"), ("getGpuType", "get", "/v2/catalog/gpus/{id}"),
               ("getSshKeys", "get", "/v2/account/ssh-keys"), ("createPod", "post", "/v2/pods"),
               ("getPod", "get", "/v2/pods/{id}"), ("deletePod", "delete", "/v2/pods/{id}"),
               ("listPods", "get", "/v2/pods"), ("listPodBilling", "get", "/v2/billing/pods"),
               ("podAction", "post", "/v2/pods/{id}/action")],
    "vastai": [("searchOffers", "post", "/api/v0/bundles"), ("createInstance", "put", "/api/v0/asks/{id}"),
               ("attachSshKey", "post", "/api/v0/instances/{id}/ssh"),
               ("showInstance", "get", "/api/v0/instances/{id}"),
               ("destroyInstance", "delete", "/api/v0/instances/{id}"), ("showUser", "get", "/api/v0/users/current"),
               ("showInstances", "get", "/api/v1/instances"), ("showCharges", "get", "/api/v0/charges"),
               ("manageInstance", "put", "/api/v0/instances/{id}")],
    "lambda": [("listInstanceTypes", "get", "/api/v1/instance-types"),
               ("launchInstance", "post", "/api/v1/instance-operations/launch"),
               ("getInstance", "get", "/api/v1/instances/{id}"),
               ("terminateInstance", "post", "/api/v1/instance-operations/terminate"),
               ("listSSHKeys", "get", "/api/v1/ssh-keys"), ("addSSHKey", "post", "/api/v1/ssh-keys"),
               ("listInstances", "get", "/api/v1/instances")],
}


def lookup(root: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise ValueError(f"external $ref not supported: {ref}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def deref(node: Any, root: dict[str, Any]) -> Any:
    """Follow a chain of ``$ref`` (for response objects, which are not schemas)."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        if node["$ref"] in seen:
            raise ValueError(f"$ref cycle at {node['$ref']}")
        seen.add(node["$ref"])
        node = lookup(root, node["$ref"])
    return node


def schema(node: Any, root: dict[str, Any], seen: tuple[str, ...] = (), keep: frozenset[str] | set[str] = KEEP) -> Any:
    """``node`` with its $refs resolved and only the ``keep`` keywords (and nested schemas) kept."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise ValueError(f"not a schema: {node!r}")
    if "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            raise ValueError(f"recursive schema at {ref}; not expected in the operations used")
        target = schema(lookup(root, ref), root, (*seen, ref), keep)
        rest = schema({k: v for k, v in node.items() if k != "$ref"}, root, seen, keep)
        return {"allOf": [target, rest]} if rest else target
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: schema(sub, root, seen, keep) for name, sub in value.items()}
        elif key in NESTED_ONE and isinstance(value, dict):
            out[key] = schema(value, root, seen, keep)
        elif key in NESTED_MANY:
            out[key] = [schema(sub, root, seen, keep) for sub in value]
        elif key in keep:
            out[key] = copy.deepcopy(value)
    return out


def request(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """``{"query": object schema, "body": schema or None}``: the query parameters as one closed
    object (a name the document does not list is refused), and the JSON body."""
    op = doc["paths"][path][method]
    params = [deref(p, doc) for p in (*doc["paths"][path].get("parameters", []), *op.get("parameters", []))]
    query = {"type": "object", "additionalProperties": False, "required": [], "properties": {}}
    for param in params:
        if param.get("in") != "query":
            continue
        query["properties"][param["name"]] = schema(param.get("schema", {}), doc, keep=KEEP_REQUEST)
        if param.get("required"):
            query["required"].append(param["name"])
    body = None
    content = (deref(op["requestBody"], doc).get("content") or {}) if "requestBody" in op else {}
    if "application/json" in content and "schema" in content["application/json"]:
        body = schema(content["application/json"]["schema"], doc, keep=KEEP_REQUEST)
    return {"query": query, "body": body}


def responses(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    op = doc["paths"][path][method]
    out: dict[str, Any] = {}
    for status, response in op["responses"].items():
        response = deref(response, doc)
        content = response.get("content") or {}
        media = next((content[m] for m in ("application/json", "application/problem+json") if m in content), None)
        # no body (e.g. 204): the fixture, if any, must be empty; "false" admits no JSON value
        out[str(status)] = schema(media["schema"], doc) if media and "schema" in media else False
    return out


def types_of_example(example: dict[str, Any]) -> dict[str, Any]:
    """A schema from an example object: each field's JSON type, or null (examples are not schemas)."""
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    props: dict[str, Any] = {}
    for key, value in example.items():
        if value is None:
            props[key] = {}
        else:
            props[key] = {"type": [names[type(value)], "null"]}
    return {"type": "object", "properties": props}


def obj(required: list[str], **props: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props}


def runpod_extras(ops: dict[str, Any]) -> list[str]:
    """GraphQL, which the REST document does not cover: shapes from anchors-provider-apis.md §1."""
    errors = {"type": "array", "minItems": 1, "items": obj(["message"], message={"type": "string"})}
    lowest = {"type": ["object", "null"], "properties": {
        "minimumBidPrice": {"type": ["number", "null"]}, "uninterruptablePrice": {"type": ["number", "null"]},
        "stockStatus": {"type": ["string", "null"]},
        "availableGpuCounts": {"type": "array", "items": {"type": "integer"}}}}
    gpu_type = obj(["id"], id={"type": "string"}, displayName={"type": "string"}, memoryInGb={"type": "number"},
                   secureCloud={"type": "boolean"}, communityCloud={"type": "boolean"}, lowestPrice=lowest)
    gpu_types = obj(["data"], data=obj(["gpuTypes"], gpuTypes={"type": "array", "items": gpu_type}))
    pod = obj(["id"], id={"type": "string"}, desiredStatus={"type": "string"}, costPerHr={"type": "number"})
    rented = obj(["data"], data=obj(["podRentInterruptable"], podRentInterruptable=pod))
    refused = obj(["errors"], errors=errors, data={"type": ["object", "null"]})
    ops["graphql.gpuTypes"] = {"method": "post", "path": "/graphql",
                               "responses": {"200": {"anyOf": [gpu_types, refused]}}}
    ops["graphql.podRentInterruptable"] = {"method": "post", "path": "/graphql",
                                           "responses": {"200": {"anyOf": [rented, refused]}}}
    deployed = obj(["data"], data=obj(["podFindAndDeployOnDemand"], podFindAndDeployOnDemand=pod))
    ops["graphql.podFindAndDeployOnDemand"] = {"method": "post", "path": "/graphql",
                                               "input": deploy_input(),
                                               "responses": {"200": {"anyOf": [deployed, refused]}}}
    return [
        "REST: the document's server is https://api.runpod.io and its paths start with /v2 "
        "(anchors-provider-apis.md agrees: REST v1 at rest.runpod.io/v1 is deprecated).",
        "createPod: the document's table lists 402 (insufficient balance) and 5xx; they have no entry of "
        "their own, so they take the 'default' response (ErrorResponse).",
        "deletePod 204 has no body: 'false' admits none.",
        "graphql.*: not in the REST document. Shapes from ../shared/reference/anchors-provider-apis.md §1 "
        "(GraphQL gpuTypes/lowestPrice and podRentInterruptable; errors as HTTP 200 with "
        "{\"errors\":[{\"message\"}]}). The selection sets are the ones runpod.py sends, so a response "
        "has exactly these fields. Their requests have no published schema: none is kept, except where "
        "RunPod's own client gives one (the project's rule: where a document is silent or loose, the official "
        "client decides).",
        "graphql.podFindAndDeployOnDemand input: the fields runpod-python's create_pod can send "
        "(runpod/api/mutations/pods.py, generate_pod_deployment_mutation, commit 07fc6e2b), with their types; "
        "closed, so a field the client never sends is refused. name, imageName, cloudType and gpuTypeId are "
        "required (without gpuTypeId the client sends deployCpuPod instead); cloudType is ALL, COMMUNITY or "
        "SECURE (create_pod's check); dataCenterId may be null (the client sends null when none is given).",
        "createPod request: the document's own schema, closed by it (unevaluatedProperties false); "
        "gpu.minCudaVersion is MAJOR.MINOR (pattern ^\\d+\\.\\d+$), where the catalog's query also admits "
        "a bare major.",
    ]


def deploy_input() -> dict[str, Any]:
    """The ``input`` of GraphQL ``podFindAndDeployOnDemand`` as runpod-python's create_pod shapes it."""
    text, integer, boolean = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
    env = {"type": "object", "required": ["key", "value"], "additionalProperties": False,
           "properties": {"key": text, "value": text}}
    fields = {"name": text, "imageName": text, "cloudType": {"enum": ["ALL", "COMMUNITY", "SECURE"]},
              "startSsh": boolean, "gpuTypeId": text, "supportPublicIp": boolean, "gpuCount": integer,
              "volumeInGb": integer, "minVcpuCount": integer, "minMemoryInGb": integer,
              "allowedCudaVersions": {"type": "array", "items": text}, "dataCenterId": {"type": ["string", "null"]},
              "dockerArgs": text, "countryCode": text, "containerDiskInGb": integer, "ports": text,
              "volumeMountPath": text, "env": {"type": "array", "items": env}, "templateId": text,
              "networkVolumeId": text, "minDownload": integer, "minUpload": integer}
    return {"type": "object", "required": ["name", "imageName", "cloudType", "gpuTypeId"],
            "additionalProperties": False, "properties": fields}


def vastai_extras(doc: dict[str, Any], ops: dict[str, Any]) -> list[str]:
    # the document types an offer as a free object; the types come from its own response example
    example = doc["paths"]["/api/v0/bundles"]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    offer = types_of_example(example["offers"])
    for key in ("id", "num_gpus", "machine_id", "host_id"):
        offer["properties"][key] = {"type": "integer"}
    offer["required"] = ["id"]
    ops["searchOffers"]["responses"]["200"] = {"type": "object", "required": ["offers"], "properties": {
        "offers": {"type": "array", "items": offer}}}
    instance = ops["showInstance"]["responses"]["200"]["properties"]["instances"]
    instance["properties"]["ports"] = {"anyOf": [
        instance["properties"]["ports"],
        {"type": "object", "additionalProperties": {"type": "array", "items": {
            "type": "object", "properties": {"HostIp": {"type": "string"}, "HostPort": {"type": "string"}}}}}]}
    instance["type"] = ["object", "null"]
    # the document puts the two-element bound on the list of sort keys, where its text says
    # each entry has two elements (a field name and a direction)
    order = ops["searchOffers"]["request"]["body"]["properties"]["order"]
    order["items"].update(minItems=2, maxItems=2)
    order.pop("minItems", None)
    order.pop("maxItems", None)
    # env is an object on the wire (Vast's guide; the official client converts a flag string into one)
    ops["createInstance"]["request"]["body"]["properties"]["env"] = {
        "type": "object", "additionalProperties": {"type": "string"}}
    # driver_version is filtered as the client's zero-padded number (550.54.15 -> 550054015)
    number = {"type": "integer"}
    ops["searchOffers"]["request"]["body"]["properties"]["driver_version"] = {
        "type": "object", "additionalProperties": False,
        "properties": {**{op: number for op in ("eq", "neq", "gt", "gte", "lt", "lte")},
                       "in": {"type": "array", "items": number}, "notin": {"type": "array", "items": number}}}
    return [
        "Paths: the document lists them without a trailing slash; vastai.py sends them with one, as Vast's "
        "own CLI does. The operations are the same.",
        "searchOffers 200: the document types each offer as {type: object, additionalProperties: true}. The "
        "field types here are derived from the document's own response example (every number as 'number', "
        "each field also nullable, since an example is not a schema); id, num_gpus, machine_id and host_id "
        "are integers. The example's 'offers' is a single object although the schema says array; the array "
        "is kept.",
        "showInstance 200: 'ports' is int[] in the document; anchors-provider-apis.md §2 records that Vast "
        "sends it Docker-style ({\"22/tcp\": [{\"HostIp\", \"HostPort\"}]}) in practice, so both are admitted. "
        "'instances' is also admitted as null (an instance Vast no longer lists).",
        "A 404 from searchOffers means an invalid or missing API key, per the document.",
        "searchOffers request 'order': the document bounds the list of sort keys to two items; its text says "
        "each entry has two elements (field, direction), so the bound is moved onto each entry.",
        "searchOffers takes no cursor: a caller pages by the sort key (dph_total gte the last price, id notin "
        "the offers already seen at that price), with the operators the document lists.",
        "createInstance request 'env': the document types it as a Docker-flag string (\"-e K=V -p 8000:8000\"). "
        "Vast's guide to creating instances says it is a JSON object ({\"KEY\": \"value\"}, port maps as keys "
        "such as \"-p 8000:8000\": \"1\"), and the official vastai client (1.9.x, build_create_instance_payload "
        "with utils.parse_env) turns a flag string into that object before sending: an object of strings is "
        "kept, a string refused.",
        "searchOffers request 'driver_version': the document says \"XXX.XX.XX\"; the official client "
        "(api/query.py numeric_version) sends it as one number, each part zero-padded to three digits "
        "(550.54.15 -> 550054015), the form the offers' driver_vers carries. Its operators take integers.",
        "showCharges: 'select_filters' is a JSON text in the query ({\"day\": {\"gte\", \"lte\"}} in unix "
        "seconds, required, and optionally {\"type\": {\"in\": [\"instance\"]}}), as the document's examples "
        "and the official client send it.",
    ]


def lambda_extras(ops: dict[str, Any]) -> list[str]:
    names = ops["launchInstance"]["request"]["body"]["properties"]["ssh_key_names"]
    names.update(minItems=1, maxItems=1)
    error = obj(["error"], error=obj(["code", "message"], code={"type": "string"}, message={"type": "string"},
                                     suggestion={"type": "string"}))
    for op in ops.values():
        op["responses"].setdefault("429", error)
    return [
        "Base URL https://cloud.lambda.ai (the document's first server; cloud.lambdalabs.com is deprecated).",
        "Error bodies are {\"error\": {code, message, suggestion?}}; each response lists the codes it can carry.",
        "launchInstance request ssh_key_names: exactly one item, from the document's text (\"Currently, exactly "
        "one SSH key must be specified\"); its schema does not say so.",
        "429: the document states rate limits (1 request/s; one launch per 12 s) but lists no 429 response. "
        "A 429 carries the usual error body; its code is not documented, so any string is admitted.",
    ]


def close_bodies(ops: dict[str, Any]) -> list[str]:
    """Request bodies that list their fields but leave others open are closed, so a renamed field fails."""
    closed = []
    for op_id, op in ops.items():
        body = op.get("request", {}).get("body")
        if (isinstance(body, dict) and body.get("type") == "object" and "properties" in body
                and "additionalProperties" not in body and "unevaluatedProperties" not in body):
            body["additionalProperties"] = False
            closed.append(op_id)
    if not closed:
        return []
    return [f"Request bodies closed here (additionalProperties false; the document leaves them open, so a "
            f"misspelt field would pass): {', '.join(closed)}."]


def load(path: Path) -> dict[str, Any]:
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(path.read_text())
    return json.loads(path.read_text())


def extract(reference: Path) -> None:
    for provider, source in SOURCES.items():
        doc = load(reference / source["file"])
        ops = {op_id: {"method": method, "path": path, "request": request(doc, method, path),
                       "responses": responses(doc, method, path)}
               for op_id, method, path in OPERATIONS[provider]}
        for op_id, method, path in OPERATIONS[provider]:
            found = doc["paths"][path][method].get("operationId")
            if found != op_id:
                raise SystemExit(f"{provider}: {method.upper()} {path} is {found!r} in the document, not {op_id!r}")
        if provider == "runpod":
            notes = runpod_extras(ops)
        elif provider == "vastai":
            notes = vastai_extras(doc, ops)
        else:
            notes = lambda_extras(ops)
        notes += close_bodies(ops)
        out = {
            "$comment": "Request and response schemas extracted by extract.py; fixtures and sent requests are "
                        "validated against them.",
            "source": {"document": source["file"], "title": doc["info"]["title"], "version": doc["info"]["version"],
                       "openapi": doc["openapi"], "published": source["published"], "commit": source["commit"]},
            "extracted": "response bodies: field names, types, required, enum/const, combinators; $refs "
                         "resolved inline; descriptions, examples, formats and value constraints dropped. "
                         "Requests (query as one closed object, and body): the same, with value constraints "
                         "(pattern, bounds) kept",
            "notes": notes,
            "operations": ops,
        }
        (HERE / f"{provider}.json").write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":
    extract(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/reference/openapi"))
