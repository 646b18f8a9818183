"""The served OpenAPI schema, fuzzed by schemathesis: whatever a client sends, allowed by the schema or
not, the server answers without a 5xx, in the content type and shape its schema states.

The queue's worker is not started, so generated jobs that pass the checks only wait (and the queue's
limit then answers 429). ``GET /v1/events`` streams until the client leaves, so it is not fuzzed; its
job-scoped sibling is (it ends at once for an unknown or finished job). Examples are few and derandomized:
the run is the same every time. Each operation is a test of its own, and a test checks that the list
names every operation the server serves.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from modular.serving import Limits
from tests.http.load_helpers import make_repos, serving

EXAMPLES = int(
    os.environ.get("MODULAR_SCHEMA_EXAMPLES", "8")
)  # per operation and mode; more by hand for a longer hunt
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]
STREAMS_FOREVER = {("GET", "/v1/events")}
OPERATIONS = [
    ("GET", "/healthz"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("DELETE", "/v1/jobs/{job_id}"),
    ("GET", "/v1/jobs/{job_id}/result"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/queue"),
    ("POST", "/v1/queue/pause"),
    ("POST", "/v1/queue/resume"),
    ("GET", "/v1/manager"),
    ("GET", "/v1/memory"),
    ("GET", "/v1/workflows"),
    ("GET", "/"),
]


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory):
    repos = make_repos(tmp_path_factory.mktemp("repos"))
    limits = Limits(max_steps=2, max_images=2, max_pixels=32 * 32)
    state = tmp_path_factory.mktemp("state")
    with serving(repos, state, limits=limits, start=False, max_body=64 * 1024, max_upload=4096) as served:
        served.scheduler.max_queue = 20
        yield schemathesis.openapi.from_url(f"{served.url}/openapi.json")


def test_the_fuzzed_operations_are_every_operation_served(served_schema):
    """OPERATIONS (and the one stream left out) are the schema's operations, no more, no fewer."""
    served = {(result.ok().method.upper(), result.ok().path) for result in served_schema.get_all_operations()}
    assert served == set(OPERATIONS) | STREAMS_FOREVER


# Operations with a body or a query of more than strings: the ones a request can break the schema of.
REFUSABLE = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}/result"),
    ("GET", "/v1/manager"),
]
CASES = [(*operation, GenerationMode.POSITIVE) for operation in OPERATIONS] + [
    (*operation, GenerationMode.NEGATIVE) for operation in REFUSABLE
]


@pytest.mark.parametrize(
    ("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES]
)
def test_no_request_gets_a_server_error(served_schema, method, path, mode):
    """EXAMPLES requests to the operation (valid ones, or ones its schema refuses): no 5xx, and each answer
    in the content type and shape the schema states."""
    operation = served_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    def fuzz(case):
        case.call_and_validate(checks=CHECKS, timeout=30)

    fuzz()


def test_the_job_schema_names_the_served_workflows_and_the_limits(served_schema):
    """A client made from the schema sends what this server takes: the workflows it serves, at most its
    ``max_steps`` and ``max_images``."""
    body = served_schema.raw_schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    properties = body["schema"]["properties"]
    assert properties["workflow"]["enum"] == ["tiny-flux:text2image", "tiny-sd"]
    assert body["schema"]["required"] == ["workflow", "prompt"]  # two are served: a request names one
    assert properties["steps"]["maximum"] == 2
    assert properties["images_per_prompt"]["maximum"] == 2


def test_the_manager_table_as_text_is_in_the_schema(served_schema):
    """``GET /v1/manager?format=text`` answers text/plain, which its schema documents (schemathesis found
    the undocumented content type)."""
    content = served_schema.raw_schema["paths"]["/v1/manager"]["get"]["responses"]["200"]["content"]
    assert set(content) == {"application/json", "text/plain"}
