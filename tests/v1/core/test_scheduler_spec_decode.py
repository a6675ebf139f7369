"""The scheduler under speculative decoding: drafts in (update_draft_token_ids),
drafts scheduled for verification (cut by the token budget and max_model_len),
rejected drafts rolled back, the acceptance stats, and the prefix cache, which
must only ever hold real tokens. Cases after upstream's
tests/v1/core/test_scheduler.py (test_schedule_spec_decoding_stats and the
spec-token cases)."""

from concurrent.futures import Future

import pytest

from tests.utils import make_tiny_tokenizer
from tests.v1.core.scheduler_utils import (
    create_requests,
    create_scheduler,
    make_request,
)
from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine import FinishReason
from vllm.v1.outputs import DraftTokenIds, LogprobsLists, ModelRunnerOutput
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output.backend_types import StructuredOutputOptions

pytestmark = pytest.mark.cpu_test


def runner_output(scheduler_output, sampled: list[list[int]]) -> ModelRunnerOutput:
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def step(scheduler, sampled: list[list[int]]):
    """schedule() then update_from_output() with `sampled` (in the order of
    num_scheduled_tokens); returns (scheduler_output, engine_core_outputs)."""
    out = scheduler.schedule()
    return out, scheduler.update_from_output(out, runner_output(out, sampled))


# (drafts per request, tokens the runner returns, (num_drafts, num_draft_tokens,
#  num_accepted_tokens, num_accepted_tokens_per_pos)); as upstream's cases.
STATS_CASES = [
    ([[1, 2, 3]], [[1, 2, 3, 4]], (1, 3, 3, [1, 1, 1])),  # all accepted
    ([[1, 2, 3]], [[1, 5]], (1, 3, 1, [1, 0, 0])),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], (2, 3, 3, [2, 1])),  # two requests
    ([[1]], [[1, 2]], (1, 1, 1, [1])),  # one draft token
    ([[]], [[5]], (0, 0, 0, [0])),  # no draft
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7], [4, 8]], (2, 6, 3, [2, 1, 0])),
]


@pytest.mark.parametrize("spec_tokens,output_tokens,expected", STATS_CASES)
def test_schedule_spec_decoding_stats(spec_tokens, output_tokens, expected):
    num_spec_tokens = max(1, max(len(t) for t in spec_tokens))
    scheduler = create_scheduler(num_speculative_tokens=num_spec_tokens, log_stats=True)
    requests = create_requests(num_requests=len(spec_tokens), num_tokens=1)
    for request in requests:
        scheduler.add_request(request)
    req_ids = [r.request_id for r in requests]

    # The prompt step: no drafts yet.
    out, engine_outputs = step(scheduler, [[0]] * len(requests))
    assert out.total_num_scheduled_tokens == len(requests)
    assert out.scheduled_spec_decode_tokens == {}
    assert engine_outputs[0].scheduler_stats.spec_decoding_stats is None

    scheduler.update_draft_token_ids(DraftTokenIds(req_ids, spec_tokens))
    for request, drafts in zip(requests, spec_tokens):
        assert request.num_computed_tokens == 1
        assert request.num_tokens == 2
        assert request.num_tokens_with_spec == 2 + len(drafts)

    # The verification step: the last sampled token plus its drafts.
    out = scheduler.schedule()
    assert out.total_num_scheduled_tokens == len(requests) + sum(map(len, spec_tokens))
    for request, drafts in zip(requests, spec_tokens):
        req_id = request.request_id
        assert out.num_scheduled_tokens[req_id] == 1 + len(drafts)
        assert out.scheduled_spec_decode_tokens.get(req_id, []) == drafts
        assert request.spec_token_ids == []  # consumed by the step
    engine_outputs = scheduler.update_from_output(out, runner_output(out, output_tokens))

    stats = engine_outputs[0].scheduler_stats.spec_decoding_stats
    if expected[0] == 0:
        assert stats is None
    else:
        assert (
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            stats.num_accepted_tokens_per_pos,
        ) == expected
    for request, drafts, tokens in zip(requests, spec_tokens, output_tokens):
        # Rejected drafts are taken back: only real tokens stay computed
        # (all but the newest, whose KV the next step computes).
        assert request.num_tokens == 2 + len(tokens)
        assert request.num_computed_tokens == request.num_tokens - 1
        assert list(request.output_token_ids) == [0, *tokens]


def test_spec_decoding_stats_empty_output():
    """A step that verified drafts but returned no token (e.g. discarded)
    counts no draft, and never a negative acceptance."""
    scheduler = create_scheduler(num_speculative_tokens=3, log_stats=True)
    request = create_requests(num_requests=1, num_tokens=1)[0]
    scheduler.add_request(request)
    step(scheduler, [[0]])
    scheduler.update_draft_token_ids(DraftTokenIds([request.request_id], [[1, 2, 3]]))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {request.request_id: [1, 2, 3]}
    engine_outputs = scheduler.update_from_output(out, runner_output(out, [[]]))
    stats = engine_outputs[0].scheduler_stats if engine_outputs else None
    assert stats is None or stats.spec_decoding_stats is None


def test_no_spec_tokens_scheduled_for_prefill_chunks():
    """Drafts offered while a request is mid-prefill are dropped: the next
    chunk schedules exactly the remaining prompt."""
    scheduler = create_scheduler(
        num_speculative_tokens=3, max_num_batched_tokens=50, max_model_len=1024
    )
    request = create_requests(num_requests=1, num_tokens=80)[0]
    req_id = request.request_id
    scheduler.add_request(request)
    out, _ = step(scheduler, [[]])
    assert out.num_scheduled_tokens == {req_id: 50}
    scheduler.update_draft_token_ids(DraftTokenIds([req_id], [[1, 2, 3]]))
    assert request.spec_token_ids == []

    out, _ = step(scheduler, [[42]])
    assert out.num_scheduled_tokens == {req_id: 30}
    assert out.scheduled_spec_decode_tokens == {}

    scheduler.update_draft_token_ids(DraftTokenIds([req_id], [[1, 2, 3]]))
    assert request.spec_token_ids == [1, 2, 3]
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {req_id: 4}
    assert out.scheduled_spec_decode_tokens == {req_id: [1, 2, 3]}


def test_drafts_cut_by_the_token_budget():
    """The budget runs out mid-draft: the request verifies only the drafts
    that fit; the rest are dropped (new ones come after the step)."""
    scheduler = create_scheduler(
        num_speculative_tokens=4, max_num_batched_tokens=7, max_num_seqs=2, max_model_len=64
    )
    requests = create_requests(num_requests=2, num_tokens=1)
    for request in requests:
        scheduler.add_request(request)
    step(scheduler, [[0], [0]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0", "1"], [[5, 6, 7, 8], [9, 10, 11, 12]]))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"0": 5, "1": 2}
    assert out.scheduled_spec_decode_tokens == {"0": [5, 6, 7, 8], "1": [9]}
    assert requests[1].spec_token_ids == []
    # Request 1 accepts its one draft: two tokens, nothing to roll back.
    scheduler.update_from_output(out, runner_output(out, [[5, 3], [9, 4]]))
    assert requests[0].num_computed_tokens == requests[0].num_tokens - 1 == 3
    assert requests[1].num_computed_tokens == requests[1].num_tokens - 1 == 3


def test_drafts_stop_below_max_model_len():
    """Input positions stay below max_model_len - 1: a draft run is cut so
    that even a fully accepted one (plus the bonus token) ends the request at
    max_model_len tokens exactly."""
    max_model_len = 16
    scheduler = create_scheduler(
        num_speculative_tokens=4, max_model_len=max_model_len, max_num_batched_tokens=64
    )
    request = make_request("0", num_tokens=12, max_tokens=100)
    scheduler.add_request(request)
    step(scheduler, [[1]])  # 13 tokens, 12 computed
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[2, 3, 4, 5]]))
    out = scheduler.schedule()
    # Positions 12 (the sampled token), 13 and 14 (drafts): the token sampled
    # at position 14 is the 16th and last.
    assert out.num_scheduled_tokens == {"0": 3}
    assert out.scheduled_spec_decode_tokens == {"0": [2, 3]}
    engine_outputs = scheduler.update_from_output(out, runner_output(out, [[2, 3, 9]]))
    assert request.num_tokens == max_model_len
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    (output,) = engine_outputs[0].outputs
    assert output.new_token_ids == [2, 3, 9]
    assert output.finish_reason == FinishReason.LENGTH


def test_tokens_after_a_stop_are_dropped():
    """Accepted drafts past max_tokens (or after a stop token) are not
    emitted; the request finishes."""
    scheduler = create_scheduler(num_speculative_tokens=3)
    request = make_request("0", num_tokens=4, max_tokens=3)
    scheduler.add_request(request)
    step(scheduler, [[1]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[2, 3, 4]]))
    _, engine_outputs = step(scheduler, [[2, 3, 4, 5]])
    (output,) = engine_outputs[0].outputs
    assert output.new_token_ids == [2, 3]
    assert output.finish_reason == FinishReason.LENGTH
    assert list(request.output_token_ids) == [1, 2, 3]
    assert "0" not in scheduler.requests


def test_update_draft_token_ids_skips_unknown_and_finished_requests():
    scheduler = create_scheduler(num_speculative_tokens=2)
    requests = create_requests(num_requests=2, num_tokens=3)
    for request in requests:
        scheduler.add_request(request)
    step(scheduler, [[0], [0]])
    scheduler.finish_requests("1", RequestStatus.FINISHED_ABORTED)
    scheduler.update_draft_token_ids(DraftTokenIds(["gone", "1", "0"], [[7, 7], [8, 8], [9, 9]]))
    assert requests[0].spec_token_ids == [9, 9]
    assert requests[1].spec_token_ids == []
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"0": [9, 9]}
    # An empty proposal leaves the request without drafts.
    scheduler.update_from_output(out, runner_output(out, [[9, 9, 1]]))
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[]]))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"0": 1}
    assert out.scheduled_spec_decode_tokens == {}


def test_preemption_drops_the_drafts():
    """A request preempted in the step that would verify its drafts loses
    them (its recompute has no KV for them), also from the step's output."""
    # 2 requests of 7 tokens in blocks of 4: 2 blocks each of the 5 usable.
    scheduler = create_scheduler(num_speculative_tokens=3, num_blocks=6, block_size=4)
    requests = create_requests(num_requests=2, num_tokens=7, block_size=4)
    for request in requests:
        scheduler.add_request(request)
    step(scheduler, [[0], [0]])  # 8 tokens each, 7 computed
    scheduler.update_draft_token_ids(DraftTokenIds(["0", "1"], [[1, 2, 3], [4, 5, 6]]))
    out = scheduler.schedule()
    # Request 0 needs a third block (positions 7..10); the pool has one
    # left, so request 1 (needing one more as well) is preempted.
    assert out.num_scheduled_tokens == {"0": 4}
    assert out.scheduled_spec_decode_tokens == {"0": [1, 2, 3]}
    assert out.preempted_req_ids == {"1"}
    assert requests[1].status == RequestStatus.PREEMPTED
    assert requests[1].spec_token_ids == []
    assert requests[1].num_computed_tokens == 0


def test_prefix_cache_holds_only_real_tokens():
    """Blocks filled by draft tokens are not cached: a later prompt that
    continues with the rejected drafts gets no hit past the real tokens."""
    block_size = 4
    scheduler = create_scheduler(
        num_speculative_tokens=3, enable_prefix_caching=True, block_size=block_size
    )
    prompt = [10, 11, 12, 13]
    request = make_request("0", prompt=prompt, max_tokens=10, block_size=block_size)
    scheduler.add_request(request)
    step(scheduler, [[20]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[21, 22, 23]]))
    out = scheduler.schedule()
    # Positions 4..7 fill block 1, but only position 4 holds a real token.
    assert out.num_scheduled_tokens == {"0": 4}
    pool = scheduler.kv_cache_manager.block_pool
    assert len(pool.cached_block_hash_to_block) == 1
    scheduler.update_from_output(out, runner_output(out, [[30]]))  # all rejected
    assert request.num_computed_tokens == 5

    other = make_request(
        "1", prompt=[*prompt, 20, 21, 22, 23, 24], max_tokens=1, block_size=block_size
    )
    scheduler.add_request(other)
    out = scheduler.schedule()
    assert other.num_cached_tokens == block_size  # block 0 only
    assert out.num_scheduled_tokens["1"] == 9 - block_size


def test_accepted_drafts_are_cached_once_real():
    """Accepted drafts are real tokens: their full blocks are cached (and hit
    by a later prompt) once computed."""
    block_size = 4
    scheduler = create_scheduler(
        num_speculative_tokens=3, enable_prefix_caching=True, block_size=block_size
    )
    prompt = [10, 11, 12, 13]
    request = make_request("0", prompt=prompt, max_tokens=10, block_size=block_size)
    scheduler.add_request(request)
    step(scheduler, [[20]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[21, 22, 23]]))
    step(scheduler, [[21, 22, 23, 24]])  # all accepted + bonus
    assert request.num_computed_tokens == 8 and request.num_tokens == 9
    step(scheduler, [[25]])  # computes position 8; blocks 0 and 1 are real
    other = make_request(
        "1", prompt=[*prompt, 20, 21, 22, 23, 24, 99], max_tokens=1, block_size=block_size
    )
    scheduler.add_request(other)
    scheduler.schedule()
    assert other.num_cached_tokens == 2 * block_size


def test_no_stats_without_log_stats():
    scheduler = create_scheduler(num_speculative_tokens=2)
    request = create_requests(num_requests=1, num_tokens=2)[0]
    scheduler.add_request(request)
    _, engine_outputs = step(scheduler, [[0]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[1, 2]]))
    _, engine_outputs = step(scheduler, [[1, 5]])
    assert engine_outputs[0].scheduler_stats is None


def test_more_tokens_than_drafts_plus_one_is_an_error():
    scheduler = create_scheduler(num_speculative_tokens=2)
    request = create_requests(num_requests=1, num_tokens=2)[0]
    scheduler.add_request(request)
    step(scheduler, [[0]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[1, 2]]))
    out = scheduler.schedule()
    with pytest.raises(RuntimeError, match="4 tokens generated for a step with 2 draft"):
        scheduler.update_from_output(out, runner_output(out, [[1, 2, 3, 4]]))


def test_draft_token_ids_travel_msgpack():
    """The mp and Ray executors' replies are msgpack (no pickle)."""
    drafts = DraftTokenIds(["a", "b"], [[1, 2, 3], []])
    decoded = RpcDecoder().decode(RpcEncoder().encode(drafts))
    assert isinstance(decoded, DraftTokenIds)
    assert decoded == drafts


def test_logprobs_of_every_emitted_token():
    """Under speculation a request emits several tokens per step; its
    logprobs rows follow cu_num_generated_tokens (rows of tokens past a stop
    are dropped with the tokens)."""
    scheduler = create_scheduler(num_speculative_tokens=2)
    requests = [
        make_request("0", num_tokens=3, max_tokens=20, logprobs=0),
        make_request("1", num_tokens=3, max_tokens=2, logprobs=0),
    ]
    for request in requests:
        scheduler.add_request(request)
    step(scheduler, [[1], [1]])
    scheduler.update_draft_token_ids(DraftTokenIds(["0", "1"], [[5, 6], [7, 8]]))
    out = scheduler.schedule()
    # Rows: request 0 emits 3 tokens (rows 0-2), request 1 emits 3 (rows 3-5)
    # of which max_tokens keeps 1.
    logprobs = LogprobsLists(
        logprob_token_ids=[[t] for t in (5, 6, 9, 7, 8, 4)],
        logprobs=[[-float(i)] for i in range(6)],
        sampled_token_ranks=[1] * 6,
        cu_num_generated_tokens=[0, 3, 6],
    )
    mro = runner_output(out, [[5, 6, 9], [7, 8, 4]])
    mro.logprobs = logprobs
    outputs = {o.request_id: o for o in scheduler.update_from_output(out, mro)[0].outputs}
    assert outputs["0"].new_token_ids == [5, 6, 9]
    assert outputs["0"].new_logprobs.logprob_token_ids == [[5], [6], [9]]
    assert outputs["0"].new_logprobs.logprobs == [[-0.0], [-1.0], [-2.0]]
    assert outputs["1"].new_token_ids == [7]
    assert outputs["1"].new_logprobs.logprob_token_ids == [[7]]


@pytest.mark.parametrize("method,lookahead", [("ngram", 0), ("draft_model", 3)])
def test_lookahead_slots_for_model_drafters(method, lookahead):
    """A drafter with its own KV cache (draft model, EAGLE) writes KV for
    the positions of the drafts it proposes after the step: waiting and
    running requests get num_speculative_tokens extra slots; n-gram none.
    The lookahead blocks are never cached."""
    block_size = 4
    scheduler = create_scheduler(
        num_speculative_tokens=3,
        speculative_method=method,
        block_size=block_size,
        enable_prefix_caching=True,
    )
    assert scheduler.num_lookahead_tokens == lookahead
    request = make_request("0", num_tokens=4, block_size=block_size)
    scheduler.add_request(request)
    out = scheduler.schedule()
    (block_ids,) = out.scheduled_new_reqs[0].block_ids
    assert len(block_ids) == -(-(4 + lookahead) // block_size)
    scheduler.update_from_output(out, runner_output(out, [[1]]))
    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[2, 3, 4]]))
    out = scheduler.schedule()  # positions 4..7, then the lookahead
    assert out.num_scheduled_tokens == {"0": 4}
    (block_ids,) = scheduler.kv_cache_manager.get_blocks("0").get_block_ids()
    assert len(block_ids) == -(-(8 + lookahead) // block_size)
    assert len(scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block) == 1


def test_structured_output_keeps_the_grammar_valid_prefix(tmp_path):
    """Drafts of a structured-output request are cut where its grammar would
    reject them; the grammar itself does not move (validation rolls back),
    and the step's bitmask has one row per draft plus the bonus row."""
    from vllm.config import VllmConfig
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tokenizer = make_tiny_tokenizer(str(tmp_path))
    backend = XgrammarBackend(VllmConfig(), tokenizer=tokenizer, vocab_size=len(tokenizer))
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    scheduler = create_scheduler(num_speculative_tokens=3)
    scheduler.structured_output_manager.backend = backend
    request = make_request(
        "0", num_tokens=4, structured_outputs=StructuredOutputsParams(regex="ababab")
    )
    grammar: Future = Future()
    grammar.set_result(backend.compile_grammar(StructuredOutputOptions.REGEX, "ababab"))
    request.structured_output_request.grammar = grammar
    scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.get_grammar_bitmask(out)
    scheduler.update_from_output(out, runner_output(out, [[a]]))

    scheduler.update_draft_token_ids(DraftTokenIds(["0"], [[b, a, a]]))
    assert request.spec_token_ids == [b, a]  # "abaa" breaks the pattern
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"0": [b, a]}
    bitmask = scheduler.get_grammar_bitmask(out).grammar_bitmask
    allowed = [[t for t in (a, b) if (int(row[t // 32]) >> (t % 32)) & 1] for row in bitmask[:3]]
    assert allowed == [[b], [a], [b]]  # after "a", "ab", "aba"
    scheduler.update_from_output(out, runner_output(out, [[b, a, b]]))
    assert list(request.output_token_ids) == [a, b, a, b]
