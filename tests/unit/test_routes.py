"""The route table (runtime/routes.py): exact paths and patterns, 404 and 405 (with Allow) derived
from the table, a pattern's parameters checked before its method."""

from __future__ import annotations

import pytest

from gpux_pack.runtime.routes import Routes
from gpux_pack.runtime.tensors import RequestError


def _known(params):
    if params["model"] != "m":
        raise RequestError(f"unknown model '{params['model']}'", 404)


ROUTES = Routes([
    ("GET", "/health", "health"),
    ("GET", "/thing", "get thing"),
    ("POST", "/thing", "post thing"),
    ("GET", "/v2/models/{model}[/versions/{version}]", "metadata"),
    ("POST", "/v2/models/{model}[/versions/{version}]/infer", "infer"),
], check=_known)


@pytest.mark.parametrize("method, path, handler, params", [
    ("GET", "/health", "health", {}),
    ("GET", "/health/", "health", {}),  # a trailing slash is not part of the path
    ("POST", "/thing", "post thing", {}),
    ("GET", "/v2/models/m", "metadata", {"model": "m", "version": None}),
    ("GET", "/v2/models/m/versions/3", "metadata", {"model": "m", "version": "3"}),
    ("POST", "/v2/models/m/infer", "infer", {"model": "m", "version": None}),
    ("POST", "/v2/models/m/versions/3/infer/", "infer", {"model": "m", "version": "3"}),
    ("GET", "/v2/models/m/versions/infer", "metadata", {"model": "m", "version": "infer"}),
])
def test_a_request_finds_its_handler_and_its_parameters(method, path, handler, params):
    assert ROUTES.find(method, path) == (handler, params)


@pytest.mark.parametrize("method, path, status, message, allow", [
    ("GET", "/nope", 404, "no such endpoint: GET /nope", None),
    ("GET", "/v2/models/m/infer/more", 404, "no such endpoint: GET /v2/models/m/infer/more", None),
    ("POST", "/health", 405, "method POST not allowed here; use GET", "GET"),
    ("DELETE", "/thing", 405, "method DELETE not allowed here; use GET, POST", "GET, POST"),
    ("GET", "/v2/models/m/infer", 405, "method GET not allowed here; use POST", "POST"),
    ("GET", "/v2/models/x/infer", 404, "unknown model 'x'", None),  # the parameters first, then the method
])
def test_what_the_table_does_not_route_is_404_or_405_with_the_methods_it_does(method, path, status, message, allow):
    with pytest.raises(RequestError) as refused:
        ROUTES.find(method, path)
    assert (refused.value.status, str(refused.value), refused.value.allow) == (status, message, allow)


def test_a_route_given_twice_is_a_mistake_in_the_table():
    with pytest.raises(ValueError, match="GET /a is routed twice"):
        Routes([("GET", "/a", 1), ("GET", "/a", 2)])
