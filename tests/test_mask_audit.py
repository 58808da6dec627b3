"""The mask audit (backend/checks/mask_audit.py): a stored loss mask against the structure of the ids.

Oracle: verl 0.9.1's own Continuous Token builders (tests/verl_oracle.py) build each family's
sequence and mask; the audit finds nothing there. Then the bugs trainers' trackers describe are
made by hand on those sequences (tool output left at 1, as slime#1370; the end-of-turn token at
0; the separator a builder inserts trained on) and each is found, at its tokens, with the
message it renders named.

A clean conversation imported without ids (issue 42: every plain conversation that
``import --from openai-chat`` wrote got a ``context trained on … '\\n'`` warning) is held to the
trainers' own masks: verl 0.9.1's sequence and mask for the same generated ids, and trl's
``return_assistant_tokens_mask`` over its ``*_training`` template less the separator after each
end-of-turn token (``tests/trl_masks.py``); the audit finds nothing there, and still finds that
separator, the one after the last turn included, when it is trained on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from cli_inprocess import run_cli
from test_continuous_verl import (  # noqa: F401 - verl_ct is a fixture
    PROFILES,
    QUESTION,
    REFUSED,
    REGISTRY,
    SCHEMAS,
    handmade_turns,
    run_engine,
    script_for,
    verl_ct,
)
from test_families import script_for as families_script
from trl_masks import generated_mask, separator_positions, trl_assistant_mask
from verl_oracle import VERL_FAMILY, verl_rollout

from backend.checks.diagnostics import check
from backend.checks.mask_audit import audit_mask, generation_header, resume_markers
from backend.importers import import_file, import_records
from backend.loading.tokenizers import load_tokenizer
from backend.trace.builder import mask_runs


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def stored(prompt, response, mask, spans=(), messages=()):
    return SimpleNamespace(prompt_ids=prompt, response_ids=response, response_mask=mask, message_spans=list(spans),
                           messages=list(messages))


def runs_of(mask):
    """[(bit, start, end)] over the response."""
    out, pos = [], 0
    for bit, n in mask_runs(mask):
        out.append((bit, pos, pos + n))
        pos += n
    return out


CASES = [(p, s) for s in ("one_call", "parallel_calls", "two_rounds") for p in PROFILES if (p, s) not in REFUSED]


@pytest.mark.parametrize(("profile", "scenario"), CASES)
def test_verls_own_sequences_pass_on_every_family(profile, scenario):
    bundle = load_tokenizer(profile)
    turns = handmade_turns(profile, bundle, scenario)
    prompt, response, mask = verl_rollout(bundle, VERL_FAMILY[profile], QUESTION, SCHEMAS, turns)
    rep = audit_mask(stored(prompt, response, mask), bundle)
    assert rep.skipped is None
    assert [r.to_dict() for r in rep.runs] == []
    assert rep.turns == len(turns)
    assert rep.starts_from_mask == 0


def two_rounds(bundle):
    turns = handmade_turns("qwen3", bundle, "two_rounds")
    return verl_rollout(bundle, VERL_FAMILY["qwen3"], QUESTION, SCHEMAS, turns)


def test_tool_output_left_trainable_is_found_at_its_tokens(qwen3):
    prompt, response, mask = two_rounds(qwen3)
    ctx = [r for r in runs_of(mask) if r[0] == 0]
    assert len(ctx) == 2
    _, a, b = ctx[0]
    bad = list(mask)
    bad[a:b] = [1] * (b - a)  # slime#1370: the first tool turn's tokens trained on
    rep = audit_mask(stored(prompt, response, bad), qwen3)
    assert [(r.kind, r.start - len(prompt), r.end - len(prompt), r.expected, r.stored) for r in rep.runs] == [
        ("context_trained", a, b, 0, 1)]
    assert "<tool_response>" in rep.runs[0].text and qwen3.tokenizer.decode(response[a:b]) == rep.runs[0].text


def test_end_of_turn_token_masked_out_and_separator_trained_are_named(qwen3):
    prompt, response, mask = two_rounds(qwen3)
    first_gen_end = runs_of(mask)[0][2]
    im_end = qwen3.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert response[first_gen_end - 1] == im_end
    nl = qwen3.tokenizer.encode("\n", add_special_tokens=False)
    assert response[first_gen_end:first_gen_end + len(nl)] == nl  # verl's inserted separator
    bad = list(mask)
    bad[first_gen_end - 1] = 0
    bad[first_gen_end] = 1
    rep = audit_mask(stored(prompt, response, bad), qwen3)
    got = [(r.kind, r.start - len(prompt), r.end - len(prompt), r.text) for r in rep.runs]
    assert got == [("stop_masked", first_gen_end - 1, first_gen_end, "<|im_end|>"),
                   ("context_trained", first_gen_end, first_gen_end + 1, "\n")]


def test_a_whole_generated_turn_masked_out(qwen3):
    prompt, response, mask = two_rounds(qwen3)
    _, a, b = runs_of(mask)[2]  # the second generated turn
    bad = list(mask)
    bad[a:b] = [0] * (b - a)
    rep = audit_mask(stored(prompt, response, bad), qwen3)
    assert [(r.kind, r.start - len(prompt), r.end - len(prompt)) for r in rep.runs] == [("generated_masked", a, b)]


def test_the_loops_own_traces_pass_and_name_the_tool_message(qwen3):
    """An engine run (continuous and legacy tool turns: legacy drops a separator, which is no mask
    error) passes; with its tool output set to 1, the finding names the tool message."""
    for mode in ("continuous", "legacy"):
        trace, _ = run_engine(qwen3, script_for("qwen3", qwen3, "two_rounds"), REGISTRY, QUESTION, tool_turns=mode)
        assert trace.termination_reason == "no_tool_calls"
        assert audit_mask(trace, qwen3).runs == []
    step = next(s for s in trace.steps if s.state == "processing_tools")
    p = len(trace.prompt_ids)
    bad = list(trace.response_mask)
    bad[step.start - p:step.end - p] = [1] * (step.end - step.start)
    broken = trace.model_copy(update={"response_mask": bad})
    rep = audit_mask(broken, qwen3)
    assert len(rep.runs) >= 1
    roles = {r.role for r in rep.runs}
    assert "tool" in roles, [r.to_dict() for r in rep.runs]
    findings = [f for f in check(broken, qwen3) if f.code == "mask_structure"]
    assert findings and all(f.severity == "warning" for f in findings)
    assert any("context trained on" in f.message and "(tool)" in f.message for f in findings)
    assert not [f for f in check(trace, qwen3) if f.code == "mask_structure"]


def test_mistral_resumes_after_tool_results_with_no_header():
    """Mistral writes no assistant header: generation resumes after [/TOOL_RESULTS]; the loop's
    trace passes, and its </s> masked out is found."""
    bundle = load_tokenizer("mistral")
    assert generation_header(bundle) == []
    assert bundle.tokenizer.decode(resume_markers(bundle)[1]) == "[/TOOL_RESULTS]"
    trace, _ = run_engine(bundle, families_script("mistral", bundle), REGISTRY, QUESTION)
    assert trace.termination_reason == "no_tool_calls", [s.error for s in trace.steps]
    rep = audit_mask(trace, bundle)
    assert rep.runs == [] and rep.starts_from_mask == 0 and rep.turns == 2
    gen = next(s for s in trace.steps if s.state == "generating")
    p = len(trace.prompt_ids)
    bad = list(trace.response_mask)
    bad[gen.end - 1 - p] = 0  # its </s>
    rep = audit_mask(trace.model_copy(update={"response_mask": bad}), bundle)
    assert [(r.kind, r.text) for r in rep.runs] == [("stop_masked", "</s>")]


def test_a_template_with_no_tool_role_takes_turn_starts_from_the_mask():
    """Gemma 3's own template renders no tool turn: no marker after tool output, so the start of
    the next generated turn comes from the mask (said in the report); ends are still read."""
    bundle = load_tokenizer("gemma3")
    header, after_tool = resume_markers(bundle)
    assert bundle.tokenizer.decode(header) == "<start_of_turn>model\n" and after_tool == []
    enc = bundle.tokenizer
    eot = enc.convert_tokens_to_ids("<end_of_turn>")
    gen1 = enc.encode("Let me look.", add_special_tokens=False) + [eot]
    ctx = enc.encode("\n<start_of_turn>user\nresult: 22<end_of_turn>\n<start_of_turn>model\n", add_special_tokens=False)
    gen2 = enc.encode("It is 22.", add_special_tokens=False) + [eot]
    resp = gen1 + ctx + gen2
    mask = [1] * len(gen1) + [0] * len(ctx) + [1] * len(gen2)
    rep = audit_mask(stored([2], resp, mask), bundle)
    assert rep.runs == [] and rep.turns == 2
    bad = list(mask)
    bad[len(gen1)] = 1  # the separator after <end_of_turn>
    rep = audit_mask(stored([2], resp, bad), bundle)
    assert [(r.kind, r.text) for r in rep.runs] == [("context_trained", "\n")]


def test_an_imported_verl_row_with_tool_output_trained_is_reported_by_check(qwen3, tmp_path):
    """From a file: a verl agent-loop row whose mask trains on the tool output; `check` (the CLI's
    diagnostics) names the run."""
    prompt, response, mask = two_rounds(qwen3)
    _, a, b = [r for r in runs_of(mask) if r[0] == 0][1]
    bad = list(mask)
    bad[a:b] = [1] * (b - a)
    f = tmp_path / "rollout.jsonl"
    f.write_text(json.dumps({"prompt_ids": prompt, "response_ids": response, "response_mask": bad}) + "\n")
    res = import_file(str(f), "verl", tokenizer="qwen3")
    (trace,) = res.traces
    assert trace.response_mask == bad
    found = [x for x in check(trace, qwen3) if x.code == "mask_structure"]
    assert [(x.details["start"] - len(prompt), x.details["end"] - len(prompt)) for x in found] == [(a, b)]
    assert "context trained on" in found[0].message


def test_mask_of_the_wrong_length_is_skipped_with_the_reason(qwen3):
    rep = audit_mask(stored([1, 2], [3, 4, 5], [1, 1]), qwen3)
    assert rep.skipped == "the mask has 2 bits for 3 response ids"


# ---- a clean conversation, imported: the trainers' masks, and nothing for the audit -------------

PLAIN = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
         {"role": "assistant", "content": "Goodbye."}]
# what a full render writes after the last turn's end-of-turn token, per profile
AFTER_LAST = {"qwen3": "\n", "llama3": ""}


def imported(bundle, messages, tools=()):
    """The trace ``import --from openai-chat`` writes for a plain ``{"messages", "tools"}`` record."""
    res = import_records([{"messages": messages, "tools": list(tools)}], "openai-chat", bundle=bundle)
    (t,) = res.traces
    assert t.metadata["ids"] == "rendered"
    return t


def conversation(turns):
    """verl's turns as the conversation a chat log holds: the question, then each assistant message
    and its tool results."""
    out = [dict(m) for m in QUESTION]
    for _, assistant, tools in turns:
        out.append(assistant)
        out.extend(tools or [])
    return out


@pytest.mark.parametrize(("profile", "scenario"), [
    (p, s) for p in sorted(AFTER_LAST) for s in ("one_call", "parallel_calls", "two_rounds") if (p, s) not in REFUSED])
def test_an_imported_conversation_is_verls_sequence_and_mask(profile, scenario):
    """The trainer's view: verl 0.9.1's ToolAgentLoop, fed the ids the model generated for each
    turn, builds the prompt, response and mask the importer renders from the same conversation;
    the render adds only what the template writes after the last turn (Qwen's '\\n'), at 0. Before
    issue 42 the importer had every '\\n' after <|im_end|> at 1 (verl: 0, an inserted separator)."""
    bundle = load_tokenizer(profile)
    turns = handmade_turns(profile, bundle, scenario)
    prompt, response, mask = verl_rollout(bundle, VERL_FAMILY[profile], QUESTION, SCHEMAS, turns)
    t = imported(bundle, conversation(turns), SCHEMAS)
    n = len(response)
    assert t.prompt_ids == prompt
    assert t.response_ids[:n] == response
    assert t.response_mask[:n] == mask
    assert bundle.tokenizer.decode(t.response_ids[n:]) == AFTER_LAST[profile] and set(t.response_mask[n:]) <= {0}
    assert audit_mask(t, bundle).runs == []
    assert not [f for f in check(t, bundle) if f.code == "mask_structure"]


@pytest.mark.parametrize("profile", ["qwen3", "gemma3"])
def test_an_imported_plain_conversation_is_trls_mask_less_the_separators(profile):
    """trl's assistant mask (return_assistant_tokens_mask over its *_training template) counts the
    whitespace after each end-of-turn token as assistant; the imported mask is that mask with
    exactly those tokens at 0 (one per assistant turn, the last turn's included), so `check` says
    it as the expected mask difference (info) and the audit finds nothing."""
    bundle = load_tokenizer(profile)
    t = imported(bundle, PLAIN)
    ids, trl = trl_assistant_mask(bundle, PLAIN)
    assert t.input_ids == ids
    differ = [k for k in range(len(ids)) if trl[k] != t.full_mask[k]]
    assert differ == [k for k in separator_positions(bundle, ids) if trl[k]]
    assert len(differ) == 2 and differ[-1] == len(ids) - 1  # after each assistant turn, the last token
    assert all(ids[k - 1] in bundle.stop_token_ids and bundle.tokenizer.decode([ids[k]]) == "\n" for k in differ)
    assert t.full_mask == generated_mask(bundle, ids, trl)
    assert audit_mask(t, bundle).runs == []
    findings = check(t, bundle)
    assert not [f for f in findings if f.code == "mask_structure"]
    assert [(f.severity, f.details["expected"]) for f in findings if f.code == "mask_mismatch"] == [("info", True)]
    assert not [f for f in findings if f.severity in ("warning", "error")], [f.message for f in findings]


def test_the_separator_after_the_last_turn_is_context_and_found_when_trained(qwen3):
    """The audit's reading of the last separator: a full render ends '<|im_end|>\\n'; the '\\n' is
    context like the one between turns. At 0 (the importer's mask) or absent (a loop's or verl's
    sequence ends at <|im_end|>) there is nothing to say; trained on (the mask the importer wrote
    before issue 42, trl's) it is found, at the last position, in the assistant message it ends."""
    t = imported(qwen3, PLAIN)
    resp, mask, p = t.response_ids, t.response_mask, len(t.prompt_ids)
    assert qwen3.tokenizer.decode(resp[-2:]) == "<|im_end|>\n" and mask[-2:] == [1, 0]
    assert audit_mask(t, qwen3).runs == []
    assert audit_mask(stored(t.prompt_ids, resp[:-1], mask[:-1]), qwen3).runs == []
    end = len(t.input_ids)
    last = [*mask[:-1], 1]
    rep = audit_mask(t.model_copy(update={"response_mask": last}), qwen3)
    assert [(r.kind, r.start, r.end, r.text, r.message, r.role) for r in rep.runs] == [
        ("context_trained", end - 1, end, "\n", 4, "assistant")]
    _, trl = trl_assistant_mask(qwen3, PLAIN)
    rep = audit_mask(t.model_copy(update={"response_mask": trl[p:]}), qwen3)
    assert [(r.kind, r.end - r.start, r.text, r.message) for r in rep.runs] == [
        ("context_trained", 1, "\n", 2), ("context_trained", 1, "\n", 4)]
    assert rep.runs[-1].end == end


def test_check_on_what_import_from_openai_chat_wrote_gives_no_mask_warning(tmp_path):
    """The report of issue 42, end to end: `import --from openai-chat --tokenizer qwen3` on a plain
    conversation and on one with a tool call, then `check` on the file it wrote: no mask_structure
    finding, no warning at all; trl's mask differs only by the separators (info)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp": 18})},
            {"role": "assistant", "content": "It is 18 degrees in Paris."}]
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in (
        {"messages": PLAIN[1:3]}, {"messages": PLAIN}, {"messages": call, "tools": tools})), encoding="utf-8")
    out = tmp_path / "traces.jsonl"
    imp = run_cli("import", str(src), "--from", "openai-chat", "--tokenizer", "qwen3", "--out", str(out))
    assert imp.returncode == 0, imp.stderr
    res = run_cli("check", str(out), "--tokenizer", "qwen3", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert len(report["traces"]) == 3
    findings = [f for tr in report["traces"] for f in tr["findings"]]
    assert not [f for f in findings if f["code"] == "mask_structure"]
    assert report["totals"]["warning"] == 0 and report["totals"]["error"] == 0, [f["message"] for f in findings]
    assert [(f["code"], f["severity"], f["details"]["expected"]) for f in findings if f["code"] == "mask_mismatch"] == [
        ("mask_mismatch", "info", True)] * 3
