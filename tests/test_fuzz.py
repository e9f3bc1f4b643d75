"""Property-based fuzzing of the whole API from its own OpenAPI document (app/openapi.json) with Schemathesis.

Schemathesis loads the document the app serves, generates requests for every operation — valid ones
(positive mode) and ones that break a documented constraint (negative mode: bad thread ids, wrong types,
out-of-range paging, bodies that are no JSON object, ...) — and sends them to the Flask app through its WSGI
interface with the bearer token. Every response must pass:

- `not_a_server_error`: no 5xx;
- `status_code_conformance`: the status is documented for the operation;
- `content_type_conformance`: the content type is documented for that status;
- `response_headers_conformance`: the documented required headers are there and match their schemas;
- `response_schema_conformance`: the body matches the documented schema (for an event stream, every event
  and its JSON data).

The run is bounded and reproducible: MAX_EXAMPLES per operation and mode, derandomized, no example database,
no deadline, no shrinking. Schemathesis's own pytest integration (`schemathesis.pytest.from_fixture`) does not
run under the pinned pytest 9, so the Hypothesis tests are built here from `APIOperation.as_strategy`. The
model is the scripted server of tests/llm_server.py answering "ok", so every chat request that passes
validation runs a real agent turn and writes a thread file under tmp_path.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api import OPENAPI_PATH
from tests.conftest import TOKEN, Api
from tests.llm_server import Response, ScriptedLLM

MAX_EXAMPLES = 50  # per operation and generation mode
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Short ids Hypothesis tends to generate, made beforehand so that reads and deletes also meet real threads.
SEEDED_THREADS = ("0", "A", "a", "_", "-", "00", "AA", "aa")
# The run makes ~400 requests; far fewer means generation silently stopped testing anything.
MIN_REQUESTS = 300

FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=False,
)

DOCUMENTED = {
    f"{method.upper()} {path}"
    for path, item in json.loads(OPENAPI_PATH.read_text(encoding="utf-8"))["paths"].items()
    for method in item
    if method != "parameters"
}


def test_fuzz_every_operation_against_its_schema(
    make_api: Callable[..., Api], llm: ScriptedLLM, record_property: Callable[[str, object], None]
) -> None:
    llm.default(Response(content="ok"))
    api = make_api()
    for thread_id in SEEDED_THREADS:
        api.store.create(thread_id)
    schema = schemathesis.openapi.from_wsgi("/au/api/openapi.json", api.app)
    operations = [result.ok() for result in schema.get_all_operations()]
    # Schemathesis leaves out the operation that serves the document itself; test_openapi.py checks that one.
    assert {operation.label for operation in operations} == DOCUMENTED - {"GET /au/api/openapi.json"}

    seen: Counter[tuple[str, str, int, str]] = Counter()
    started = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode is GenerationMode.NEGATIVE and not (operation.path_parameters or operation.query or operation.body):
                continue  # nothing to break in a request without parameters or body

            # A fixed Authorization header: negative mode breaks the documented inputs, not the token.
            @FUZZ_SETTINGS
            @given(case=operation.as_strategy(generation_mode=mode, headers=AUTH))
            def run(case: schemathesis.Case) -> None:
                response = case.call(headers=AUTH)
                media_type = response.headers.get("content-type", ["-"])[0].split(";")[0]
                seen[(operation.label, mode.value, response.status_code, media_type)] += 1
                case.validate_response(response, checks=CHECKS, headers=AUTH)

            run()
    elapsed = time.monotonic() - started

    total = sum(seen.values())
    record_property("fuzz_requests", total)
    record_property("fuzz_seconds", round(elapsed, 1))
    lines = [f"  {label} [{mode}] {status} {media}: {n}" for (label, mode, status, media), n in sorted(seen.items())]
    print(f"\nfuzz: {total} requests in {elapsed:.1f}s, {len(llm.chat_requests())} model calls\n" + "\n".join(lines))

    assert total >= MIN_REQUESTS, f"only {total} requests were made"
    assert {label for label, *_ in seen} == {operation.label for operation in operations}
    # The interesting paths were really reached: finished turns, plain and streamed, and invalid input rejected.
    chat = "POST /au/api/threads/{thread_id}/chat"
    assert seen[(chat, "positive", 200, "application/json")] > 0
    assert seen[(chat, "positive", 200, "text/event-stream")] > 0
    assert sum(n for (label, mode, status, _), n in seen.items() if mode == "negative" and status == 400) > 0
    assert llm.chat_requests(), "no chat turn reached the scripted model"

