"""The image's HTTP API as OpenAPI 3.1 (/openapi.json), its request and response schemas made
from the model's inputs and outputs, and /docs: one self-contained page that renders it.

GPUX serves FastAPI's /docs, /redoc and /openapi.json; its clients and tools look for them. The
page loads nothing from outside the image (no CDN: images often run without a network) and
holds no library: a few kilobytes of HTML and script, in this module, so the runtime layer
carries it like any other source."""

from __future__ import annotations

from typing import Any

from .contract import DTYPES, GpuxJson
from .tensors import ServedTensor

_JSON_TYPES = {"bool": "boolean", "string": "string"}
_V2_DATATYPES = sorted({v2 for _, v2, _ in DTYPES.values()})


def _element(dtype: str) -> dict[str, Any]:
    if dtype in _JSON_TYPES:
        return {"type": _JSON_TYPES[dtype]}
    if dtype in DTYPES:
        return {"type": "integer" if dtype[0] in "iu" else "number"}
    return {}  # a sequence or map output: whatever the model answers


def tensor_schema(spec: ServedTensor) -> dict[str, Any]:
    """A tensor as /predict carries it: nested lists, one level per dimension, fixed sizes
    bounded; an unknown shape takes any nesting."""
    schema = _element(spec.dtype)
    if spec.shape is None or spec.dtype not in DTYPES:
        return {"description": f"{spec.dtype} tensor of any shape"} if spec.dtype in DTYPES else {}
    for dim in reversed(spec.shape):
        schema = {"type": "array", "items": schema}
        if isinstance(dim, int) and dim >= 0:
            schema.update(minItems=dim, maxItems=dim)
    shown = ", ".join(str(d) for d in spec.shape)
    return {**schema, "description": f"{spec.dtype} [{shown}]"}


def _object(properties: dict[str, Any], required: list[str], more: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    if not more:
        out["additionalProperties"] = False
    return out


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _get(summary: str, schema: dict[str, Any], tag: str, not_ready: bool = False) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": _json(schema, "OK")}
    if not_ready:
        responses["503"] = _json(schema, "Loading, warming up or draining")
    return {"get": {"summary": summary, "tags": [tag], "responses": responses}}


def document(spec: GpuxJson, pack_version: str) -> dict[str, Any]:
    """OpenAPI 3.1 for this image: GPUX's endpoints and KServe v2's (REST), for this model."""
    inputs = [ServedTensor.of(t) for t in spec.inputs]
    outputs = [ServedTensor.of(t) for t in spec.outputs]
    name, version = spec.name, spec.version
    error = {"$ref": "#/components/schemas/Error"}
    errors = {str(code): _json(error, text) for code, text in (
        (400, "The request is wrong: the message names the input or the part"), (413, "Too large for this server"),
        (503, "Not ready, or busy: retry (Retry-After)"), (504, "The model took longer than serving.timeout"))}
    tensor = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
        "name": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"enum": _V2_DATATYPES}, "parameters": {"type": "object"},
        "data": {"type": "array"}}}
    schemas = {
        "PredictRequest": _object({t.name: tensor_schema(t) for t in inputs},
                                  [t.name for t in inputs if t.required]),
        "PredictResponse": _object({t.name: tensor_schema(t) for t in outputs}, []),
        "Error": _object({"error": {"type": "string"}, "detail": {"type": "string", "description": "The same "
                          "text, for GPUX's (FastAPI's) clients; not on /v2"}}, ["error"]),
        "Health": _object({"status": {"type": "string", "description": "healthy when ready"},
                           "model": {"type": "string"}, "ready": {"type": "boolean"}}, ["status", "model"]),
        "Info": _object({k: {"type": t} for k, t in (("name", "string"), ("version", "string"),
                         ("format", "string"), ("path", "string"), ("size_bytes", "integer"), ("size_mb", "number"),
                         ("inputs", "array"), ("outputs", "array"), ("metadata", "object"))},
                        ["name", "version", "format", "path", "size_bytes", "size_mb", "inputs", "outputs"]),
        "ProviderReport": _object({"provider": _object({"name": {"type": "string"}, "available": {"type": "boolean"},
                                                        "config": {"type": "object"}}, ["name", "available"]),
                                   "available_providers": {"type": "array", "items": {"type": "string"}}},
                                  ["provider", "available_providers"]),
        "InferRequest": _object({"id": {"type": "string"}, "parameters": {"type": "object"},
                                 "inputs": {"type": "array", "items": tensor},
                                 "outputs": {"type": "array", "items": _object({"name": {"type": "string"},
                                                                                "parameters": {"type": "object"}},
                                                                               ["name"])}}, ["inputs"]),
        "InferResponse": _object({"model_name": {"const": name}, "model_version": {"type": "string"},
                                  "id": {"type": "string"}, "parameters": {"type": "object"},
                                  "outputs": {"type": "array", "items": tensor}}, ["model_name", "outputs"]),
        "ModelMetadata": _object({"name": {"const": name}, "versions": {"type": "array", "items": {"type": "string"}},
                                  "platform": {"type": "string"},
                                  "inputs": {"type": "array", "items": {"type": "object"}},
                                  "outputs": {"type": "array", "items": {"type": "object"}}},
                                 ["name", "platform", "inputs", "outputs"]),
    }
    predict_body = {"oneOf": [{"$ref": "#/components/schemas/PredictRequest"},
                              {"type": "array", "minItems": 1,
                               "items": {"$ref": "#/components/schemas/PredictRequest"}}]}
    predict_answer = {"oneOf": [{"$ref": "#/components/schemas/PredictResponse"},
                                {"type": "array", "items": {"$ref": "#/components/schemas/PredictResponse"}}]}
    infer = {"post": {
        "summary": "KServe v2 inference (JSON, or the binary tensor extension)", "tags": ["KServe v2"],
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
            "application/octet-stream": {"schema": {"type": "string", "contentMediaType": "application/octet-stream",
                                                    "description": "A JSON header of Inference-Header-Content-Length "
                                                                   "bytes, then the binary tensors"}}}},
        "responses": {"200": {"description": "The outputs", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/InferResponse"}},
            "application/octet-stream": {"schema": {"type": "string"}}}}, **errors}}}
    model_path = f"/v2/models/{name}"
    paths: dict[str, Any] = {
        "/health": _get("GPUX's health: healthy when ready", {"$ref": "#/components/schemas/Health"}, "GPUX", True),
        "/info": _get("The model: name, version, size, inputs, outputs, providers, warmup",
                      {"$ref": "#/components/schemas/Info"}, "GPUX"),
        "/metrics": {"get": {"summary": "Prometheus metrics; GPUX's provider report to Accept: application/json",
                             "tags": ["GPUX"], "responses": {"200": {"description": "OK", "content": {
                                 "text/plain": {"schema": {"type": "string"}},
                                 "application/json": {"schema": {"$ref": "#/components/schemas/ProviderReport"}}}}}}},
        "/predict": {"post": {
            "summary": "Run the model: an object of input name -> nested lists, or an array of them",
            "tags": ["GPUX"],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": predict_body},
                "application/x-npy": {"schema": {"type": "string", "contentMediaType": "application/x-npy",
                                                 "description": "One .npy array, for a single-input model"}}}},
            "responses": {"200": _json(predict_answer, "The outputs, by name (an array for an array)"), **errors}}},
        "/v2": _get("KServe v2 server metadata", _object({"name": {"type": "string"}, "version": {"type": "string"},
                                                          "extensions": {"type": "array"}}, ["name"]), "KServe v2"),
        "/v2/health/live": _get("KServe v2 liveness", _object({"live": {"type": "boolean"}}, ["live"]), "KServe v2"),
        "/v2/health/ready": _get("KServe v2 readiness", _object({"ready": {"type": "boolean"}}, ["ready"]),
                                 "KServe v2", True),
        model_path: _get("KServe v2 model metadata", {"$ref": "#/components/schemas/ModelMetadata"}, "KServe v2"),
        f"{model_path}/ready": _get("KServe v2 model readiness", _object({"name": {"type": "string"},
                                                                          "ready": {"type": "boolean"}}, ["ready"]),
                                    "KServe v2", True),
        f"{model_path}/infer": infer,
        f"{model_path}/versions/{version}/infer": infer,
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": spec.title, "version": version,
                 "description": spec.description or f"{name}, served by gpux-pack {pack_version}"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


DOCS_PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>API</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:60rem;padding:0 1rem;color:#222}
h1{margin-bottom:.2rem}.op{border:1px solid #ccd;border-radius:6px;margin:.8rem 0;padding:.5rem .8rem}
.m{display:inline-block;min-width:3.5rem;font-weight:700}.get{color:#06c}.post{color:#080}
pre{background:#f6f6f9;padding:.5rem;overflow:auto;max-height:20rem}textarea{width:100%;height:8rem}
summary{cursor:pointer}code{font-size:90%}
</style></head>
<body><h1 id="title">API</h1><p id="about"></p><div id="ops">Loading openapi.json ...</div>
<script>
"use strict";
function el(tag, text, cls){const e=document.createElement(tag);if(text!==undefined)e.textContent=text;if(cls)e.className=cls;return e}
function resolve(doc, s){while(s&&s.$ref){s=doc.components.schemas[s.$ref.split("/").pop()]}return s}
function example(doc, s){s=resolve(doc,s)||{};if(s.oneOf)return example(doc,s.oneOf[0]);
 if(s.type==="object"){const o={};for(const k of Object.keys(s.properties||{}))o[k]=example(doc,s.properties[k]);return o}
 if(s.type==="array"){const n=s.minItems||1;return Array.from({length:n},()=>example(doc,s.items))}
 return s.type==="string"?"text":s.type==="boolean"?false:0}
async function tryIt(path, box, out){out.textContent="...";
 try{const r=await fetch(path.slice(1),{method:"POST",headers:{"content-type":"application/json"},body:box.value});
  out.textContent=r.status+" "+JSON.stringify(await r.json(),null,1)}catch(e){out.textContent=String(e)}}
async function main(){
 const doc=await (await fetch("openapi.json")).json();
 document.title=doc.info.title+" API";document.getElementById("title").textContent=doc.info.title+" "+doc.info.version;
 document.getElementById("about").textContent=doc.info.description;
 const ops=document.getElementById("ops");ops.textContent="";
 for(const [path,item] of Object.entries(doc.paths)){for(const [method,op] of Object.entries(item)){
  const box=el("div",undefined,"op");box.dataset.path=path;const head=el("div");
  head.append(el("span",method.toUpperCase(),"m "+method),el("code",path),el("span"," \\u2014 "+op.summary));box.append(head);
  const body=op.requestBody&&op.requestBody.content["application/json"];
  if(body){const d=el("details");d.append(el("summary","Request schema"),el("pre",JSON.stringify(resolve(doc,body.schema),null,1)));box.append(d)}
  for(const [code,r] of Object.entries(op.responses)){const c=(r.content||{})["application/json"];
   const d=el("details");d.append(el("summary",code+" "+r.description));
   if(c)d.append(el("pre",JSON.stringify(resolve(doc,c.schema),null,1)));box.append(d)}
  if(path==="/predict"){const t=el("textarea");t.value=JSON.stringify(example(doc,body.schema.oneOf[0]));
   const b=el("button","Try it");const out=el("pre");b.onclick=()=>tryIt(path,t,out);box.append(t,b,out)}
  ops.append(box)}}
 document.body.dataset.loaded="yes"}
main().catch(e=>{document.getElementById("ops").textContent="Cannot read openapi.json: "+e});
</script></body></html>
"""
