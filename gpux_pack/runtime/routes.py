"""Routes as a table: (method, path) -> handler. A path is exact, or a pattern whose `{name}`
segments are parameters and whose `[...]` parts are optional. What no route answers is 404; a
path that other methods answer is 405, with those methods in Allow. A pattern's parameters are
checked before its method, so an unknown model is 404 whatever the method asked for.

An exact path is one dictionary look-up (the serving endpoints: /predict costs no more than a
route table should), a pattern one anchored match each until one matches."""

from __future__ import annotations

import re
from typing import Callable, Generic, Iterable, Mapping, TypeVar

from .tensors import RequestError

H = TypeVar("H")
Check = Callable[[Mapping[str, str]], None]
NO_PARAMS: Mapping[str, str] = {}  # an exact path's parameters (shared: never written)


class Routes(Generic[H]):
    def __init__(self, table: Iterable[tuple[str, str, H]], check: Check | None = None):
        """table: (method, path or pattern, handler) rows; check(params) raises for parameters no
        route serves (a RequestError, 404), before the method is looked at."""
        self.exact: dict[str, dict[str, H]] = {}
        self.check = check
        patterns: dict[str, dict[str, H]] = {}
        for method, path, handler in table:
            methods = (patterns if "{" in path else self.exact).setdefault(path, {})
            if method in methods:
                raise ValueError(f"{method} {path} is routed twice")
            methods[method] = handler
        self.patterns = [(compile_pattern(path), methods) for path, methods in patterns.items()]  # in the table's order

    def find(self, method: str, path: str) -> tuple[H, Mapping[str, str]]:
        """The handler for a request and its path's parameters; a trailing slash is not part of
        the path. A RequestError when none: 404 (no such path), 405 (not this method: allow)."""
        key = path.rstrip("/") or "/"
        methods = self.exact.get(key)
        params = NO_PARAMS
        if methods is None:
            for pattern, candidates in self.patterns:
                match = pattern.match(key)
                if match is not None:
                    methods, params = candidates, match.groupdict()
                    break
            else:
                raise RequestError(f"no such endpoint: {method} {path}", 404)
            if self.check is not None:
                self.check(params)
        handler = methods.get(method)
        if handler is None:
            allowed = ", ".join(methods)
            raise RequestError(f"method {method} not allowed here; use {allowed}", 405, allow=allowed)
        return handler, params


def compile_pattern(path: str) -> re.Pattern[str]:
    """`/v2/models/{model}[/versions/{version}]/infer` as an anchored regular expression: a
    parameter is one path segment, a bracketed part optional. A parameter never gives back
    what it matched (possessive): a path that is not this pattern fails at once."""
    out, at = [], 0
    for token in re.finditer(r"\{(\w+)\}|\[|\]", path):
        out.append(re.escape(path[at:token.start()]))
        name = token.group(1)
        out.append(f"(?P<{name}>[^/]++)" if name else "(?:" if token.group(0) == "[" else ")?")
        at = token.end()
    out.append(re.escape(path[at:]))
    return re.compile("".join(out) + r"\Z")
