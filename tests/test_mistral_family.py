"""backend.families.mistral (Mistral's renderer) against its oracles: mistral-common's own encoder (a separately loaded
``MistralTokenizer`` fed a request built from mistral-common's message classes), transformers'
``MistralCommonBackend.apply_chat_template``, and vLLM's ``mistral`` tool parser."""

from __future__ import annotations

import importlib.resources
import json
import random
import re
from typing import Any

import pytest
from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, ToolMessage, UserMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.tool_calls import Function, FunctionCall, Tool, ToolCall
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from backend.errors import UserError
from backend.families.mistral import (
    MistralRenderer,
    MistralRenderError,
    decode_with_offsets,
    mistral_call_id,
    mistral_tokenizer,
    tekken_names,
)
from backend.parsers import get_parser
from backend.tokens.rendering import RenderError

TEKKEN = importlib.resources.files("mistral_common") / "data" / "tekken_240911.json"


@pytest.fixture(scope="module")
def renderer() -> MistralRenderer:
    return MistralRenderer()


@pytest.fixture(scope="module")
def oracle_tok() -> dict[ValidationMode, MistralTokenizer]:
    """mistral-common loaded on its own (not through our module or transformers)."""
    return {m: MistralTokenizer.from_file(str(TEKKEN), mode=m) for m in (ValidationMode.test, ValidationMode.finetuning)}


# ---- generated conversations -------------------------------------------------------------------

STRINGS = ["Paris", "Zürich 中文 😀", 'say "hi"\\n', "tab\there\nnewline", "", "a/b\\c", "ünïcödé ∑"]
RESULTS = ["sunny, 21°C", "42", '{"ok": true, "items": [1, 2]}', "Error: not found", "😀 done", '"quoted"', "[]"]


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    names = ["get_weather", "search_docs", "add_numbers", "no_args", "set-mode"]
    out = []
    for name in rng.sample(names, rng.randint(2, 5)):
        props = {} if name == "no_args" else {"q": {"type": "string", "description": "the query é"}, "n": {"type": "integer"}}
        out.append({"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": {
            "type": "object", "properties": props, "required": list(props)[:1]}}})
    return out


def _args(rng: random.Random) -> dict[str, Any]:
    kind = rng.randrange(4)
    if kind == 0:
        return {}
    if kind == 1:
        return {"q": rng.choice(STRINGS), "n": rng.randint(-5, 10 ** 6)}
    if kind == 2:
        return {"filter": {"tags": [rng.choice(STRINGS), None, True, 1.5], "nested": {"deep": {"x": []}}}, "q": rng.choice(STRINGS)}
    return {"q": rng.choice(STRINGS), "opts": {}}


def conversation(seed: int, *, engine_ids: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """``(messages, tools, cuts)``: HF-format messages as our engine writes them (system prompt
    maybe, 1-2 tool rounds of 1-3 parallel calls, dict or string arguments, maybe a final
    answer); ``cuts`` are the message counts at which an assistant call message ends."""
    rng = random.Random(seed)
    tools = _tools(rng)
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        msgs.append({"role": "system", "content": rng.choice(["You are a helpful agent.", "Réponds en français.\nBe brief."])})
    msgs.append({"role": "user", "content": rng.choice(["What's the weather?", "Cherche « docs » 😀", "add 2+2 then search"])})
    cuts = []
    for turn in range(rng.randint(1, 2)):
        calls = []
        for k in range(rng.randint(1, 3)):
            args = _args(rng)
            raw: Any = args if rng.random() < 0.5 else json.dumps(args, ensure_ascii=rng.random() < 0.5,
                                                                   separators=rng.choice([(",", ":"), (", ", ": ")]))
            cid = f"call_{turn + 1}_{k}" if engine_ids else "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABC0123456789") for _ in range(9))
            calls.append({"type": "function", "id": cid, "function": {"name": rng.choice(tools)["function"]["name"], "arguments": raw}})
        msgs.append({"role": "assistant", "content": "", "tool_calls": calls})
        cuts.append(len(msgs))
        for c in calls:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": rng.choice(RESULTS)})
    if rng.random() < 0.4:
        msgs.append({"role": "assistant", "content": rng.choice(["Done: 21°C in Zürich.", "Voilà 😀"])})
    return msgs, tools, cuts


def oracle_request(messages: list[dict[str, Any]], tools: list[dict[str, Any]], id_map: dict[str, str]) -> ChatCompletionRequest:
    """The same conversation built from mistral-common's own classes (not ``from_openai``)."""
    out: list[Any] = []
    for m in messages:
        if m["role"] == "system":
            out.append(SystemMessage(content=m["content"]))
        elif m["role"] == "user":
            out.append(UserMessage(content=m["content"]))
        elif m["role"] == "tool":
            out.append(ToolMessage(content=m["content"], tool_call_id=id_map.get(m["tool_call_id"], m["tool_call_id"]), name=m.get("name")))
        elif m.get("tool_calls"):
            out.append(AssistantMessage(tool_calls=[
                ToolCall(id=id_map.get(c["id"], c["id"]), function=FunctionCall(
                    name=c["function"]["name"],
                    arguments=c["function"]["arguments"] if isinstance(c["function"]["arguments"], str) else json.dumps(c["function"]["arguments"])))
                for c in m["tool_calls"]]))
        else:
            out.append(AssistantMessage(content=m["content"]))
    return ChatCompletionRequest(messages=out, tools=[Tool(function=Function(**t["function"])) for t in tools])


def oracle_ids(oracle_tok: dict, messages: list[dict[str, Any]], tools: list[dict[str, Any]], id_map: dict[str, str] | None = None) -> list[int]:
    mode = ValidationMode.finetuning if messages[-1]["role"] == "assistant" else ValidationMode.test
    return list(oracle_tok[mode].encode_chat_completion(oracle_request(messages, tools, id_map or {})).tokens)


def oracle_text(oracle_tok: dict, ids: list[int]) -> str:
    return oracle_tok[ValidationMode.test].decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)


SEEDS = list(range(14))


# ---- the tokenizer ------------------------------------------------------------------------------


def test_tokenizer_is_found_in_the_package_and_cached() -> None:
    assert "tekken_240911" in tekken_names() and "tekken_240718" in tekken_names()
    assert mistral_tokenizer() is mistral_tokenizer("tekken_240911")
    with pytest.raises(MistralRenderError, match="ships tekken_240718, tekken_240911"):
        mistral_tokenizer("tekken_nope")


def test_hf_tokenizer_surface(oracle_tok: dict) -> None:
    """What of the HF tokenizer surface our code uses works on MistralCommonBackend."""
    tok = mistral_tokenizer()
    tk = oracle_tok[ValidationMode.test].instruct_tokenizer.tokenizer
    text = 'Hello "wörld" 😀 [INST]</s>'
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == tk.encode(text, bos=False, eos=False)
    assert 3 not in ids and 2 not in ids  # control tokens are never produced by encoding text
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode([1, 3, *ids, 4, 2], skip_special_tokens=False) == f"<s>[INST]{text}[/INST]</s>"
    assert tok.convert_ids_to_tokens([1, 2, 3, 9]) == ["<s>", "</s>", "[INST]", "[TOOL_CALLS]"]
    assert tok.convert_tokens_to_ids(["[TOOL_CALLS]", "</s>", "[INST]"]) == [9, 2, 3]
    assert (tok.eos_token, tok.eos_token_id, len(tok)) == ("</s>", 2, 131072)
    assert tok.special_tokens_map == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    # not supported: offsets (decode_with_offsets replaces them) and is_fast
    with pytest.raises(ValueError, match="return_offsets_mapping"):
        tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert not getattr(tok, "is_fast", False)
    # a byte-fallback piece has no string of its own: it comes back as U+FFFD, not round-trippable
    emoji = tok.encode("😀", add_special_tokens=False)
    assert len(emoji) == 4 and set(tok.convert_ids_to_tokens(emoji)) == {"\ufffd"}


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_decode_with_offsets(renderer: MistralRenderer, seed: int) -> None:
    msgs, tools, _ = conversation(seed, engine_ids=True)
    _, ids = renderer.render(msgs, tools, add_generation_prompt=msgs[-1]["role"] != "assistant")
    ids = ids + renderer.tokenizer.encode("😀 é中 \x00", add_special_tokens=False) + [2]
    text, offsets = decode_with_offsets(renderer.tokenizer, ids)
    assert text == renderer.tokenizer.decode(ids, skip_special_tokens=False)
    assert len(offsets) == len(ids)
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    for k, (i, (s, e)) in enumerate(zip(ids, offsets)):
        assert s < e <= len(text)
        if k:
            assert s >= offsets[k - 1][0] and s <= offsets[k - 1][1]
        piece = renderer.tokenizer.convert_ids_to_tokens(i)
        if "\ufffd" not in piece:  # a whole-character token: its span is its text
            assert text[s:e] == piece


def test_decode_with_offsets_cut_character() -> None:
    tok = mistral_tokenizer()
    emoji = tok.encode("😀", add_special_tokens=False)
    text, offsets = decode_with_offsets(tok, [1, *emoji[:2], 2, *emoji])
    assert text == tok.decode([1, *emoji[:2], 2, *emoji], skip_special_tokens=False) == "<s>\ufffd</s>😀"
    assert offsets == [(0, 3), (3, 4), (3, 4), (4, 8), (8, 9), (8, 9), (8, 9), (8, 9)]
    with pytest.raises(MistralRenderError, match="not in this vocabulary"):
        decode_with_offsets(tok, [1, 10 ** 7])


# ---- render == mistral-common --------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_render_equals_mistral_common(renderer: MistralRenderer, oracle_tok: dict, seed: int) -> None:
    msgs, tools, _ = conversation(seed, engine_ids=False)  # valid 9-character ids: nothing mapped
    gen = msgs[-1]["role"] != "assistant"
    r = renderer.render_detailed(msgs, tools, add_generation_prompt=gen)
    expected = oracle_ids(oracle_tok, msgs, tools)
    assert r.token_ids == expected
    assert r.text == oracle_text(oracle_tok, expected)
    assert r.id_map == {}
    if gen:  # transformers' MistralCommonBackend (test mode) gives the same ids
        assert renderer.tokenizer.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False) == expected
    else:
        assert expected[-1] == 2  # finetuning mode closes the final assistant message


@pytest.mark.parametrize("seed", SEEDS)
def test_render_with_engine_ids(renderer: MistralRenderer, oracle_tok: dict, seed: int) -> None:
    msgs, tools, _ = conversation(seed, engine_ids=True)
    r = renderer.render_detailed(msgs, tools, add_generation_prompt=msgs[-1]["role"] != "assistant")
    engine = {c["id"] for m in msgs for c in m.get("tool_calls") or []}
    assert set(r.id_map) == engine
    assert all(re.fullmatch(r"[a-zA-Z0-9]{9}", v) for v in r.id_map.values())
    assert len(set(r.id_map.values())) == len(engine)
    assert any("ids mapped" in n for n in r.notes)
    assert r.token_ids == oracle_ids(oracle_tok, msgs, tools, r.id_map)
    for new in r.id_map.values():  # the call and its tool result carry the same id
        assert r.text.count(f'"id": "{new}"') == 1 and r.text.count(f'"call_id": "{new}"') == 1


def test_call_id_mapping() -> None:
    assert mistral_call_id("abcDEF123") == "abcDEF123"  # already valid: kept
    ids = [mistral_call_id(f"call_{t}_{k}") for t in range(1, 40) for k in range(4)]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[a-zA-Z0-9]{9}", i) for i in ids)
    assert mistral_call_id("call_1_0") == mistral_call_id("call_1_0") != mistral_call_id("call_1_1")
    for bad in ("abcdefgh", "abcdefghij", "abc_efghi", "abcdéfghi"):
        assert mistral_call_id(bad) != bad and re.fullmatch(r"[a-zA-Z0-9]{9}", mistral_call_id(bad))


def test_missing_ids_are_answered_in_order(renderer: MistralRenderer, oracle_tok: dict) -> None:
    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"function": {"name": "f", "arguments": {"a": 1}}}, {"function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "content": "one"}, {"role": "tool", "content": "two"}]
    r = renderer.render_detailed(msgs, None)
    ids = re.findall(r'"id": "(\w+)"', r.text)
    assert len(ids) == 2 and re.findall(r'"call_id": "(\w+)"', r.text) == ids
    with_ids = [msgs[0], {**msgs[1], "tool_calls": [{**c, "id": i} for c, i in zip(msgs[1]["tool_calls"], ids)]},
                {**msgs[2], "tool_call_id": ids[0]}, {**msgs[3], "tool_call_id": ids[1]}]
    assert r.token_ids == oracle_ids(oracle_tok, with_ids, [])


# ---- the tool turn ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tool_turn_is_the_suffix(renderer: MistralRenderer, oracle_tok: dict, seed: int) -> None:
    msgs, tools, cuts = conversation(seed, engine_ids=True)
    for cut in cuts:
        end = cut
        while end < len(msgs) and msgs[end]["role"] == "tool":
            end += 1
        history, new = msgs[:cut], msgs[cut:end]
        h_text, h_ids = renderer.render(history, tools, add_generation_prompt=False)
        text, ids = renderer.tool_turn(history, new, tools)
        f_text, f_ids = renderer.render(msgs[:end], tools)
        assert h_ids + ids == f_ids
        assert h_text + text == f_text
        assert h_ids[-1] == 2 and ids[0] == 7 and ids[-1] == 8  # </s> | [TOOL_RESULTS] ... [/TOOL_RESULTS]
        assert renderer.render_prefix_ok(history, new, tools)
        mapped = renderer.render_detailed(msgs[:end], tools).id_map
        assert f_ids == oracle_ids(oracle_tok, msgs[:end], tools, mapped)


def test_new_user_message_is_not_a_suffix(renderer: MistralRenderer) -> None:
    msgs, tools, _ = conversation(0, engine_ids=True)
    history = msgs + ([] if msgs[-1]["role"] == "assistant" else [{"role": "assistant", "content": "ok"}])
    new = [{"role": "user", "content": "and tomorrow?"}]
    assert not renderer.render_prefix_ok(history, new, tools)
    with pytest.raises(MistralRenderError, match="not a suffix"):
        renderer.tool_turn(history, new, tools)
    # without tools and system prompt the new user turn is a suffix
    plain = [m for m in history if m["role"] in ("user",)] + [{"role": "assistant", "content": "hi"}]
    assert renderer.render_prefix_ok(plain, new, None)


def test_final_assistant_message(renderer: MistralRenderer, oracle_tok: dict) -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "Hello there  "}]
    _, closed = renderer.render(msgs, None, add_generation_prompt=False)
    assert closed == oracle_ids(oracle_tok, msgs, []) and closed[-1] == 2
    text, open_ids = renderer.render(msgs, None, add_generation_prompt=False, kwargs={"continue_final_message": True})
    assert open_ids == closed[:-1] and text.endswith("[/INST]Hello there")  # mistral-common strips trailing spaces
    with pytest.raises(MistralRenderError, match="no generation prompt"):
        renderer.render(msgs, None, add_generation_prompt=True)
    with pytest.raises(MistralRenderError, match="continue_final_message needs"):
        renderer.render(msgs[:2], None, kwargs={"continue_final_message": True})
    r = renderer.render_detailed(msgs[:2], None, add_generation_prompt=False)
    assert r.token_ids == renderer.render(msgs[:2], None)[1] and any("no generation prompt" in n for n in r.notes)


# ---- what the model writes ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_format_text_calls_is_the_rendered_turn(renderer: MistralRenderer, seed: int) -> None:
    msgs, tools, cuts = conversation(seed, engine_ids=True)
    for cut in cuts:
        calls = msgs[cut - 1]["tool_calls"]
        _, before = renderer.render(msgs[: cut - 1], tools)
        _, after = renderer.render(msgs[:cut], tools, add_generation_prompt=False)
        turn = after[len(before):]
        assert turn == renderer.format_call_ids(calls)
        assert renderer.decode(turn) == renderer.format_text_calls(calls) + "</s>"
        # a model that writes the text canonically generates these ids: [TOOL_CALLS], the JSON, </s>
        body = renderer.format_text_calls(calls)[len("[TOOL_CALLS]"):]
        assert turn == [9, *renderer.tokenizer.encode(body, add_special_tokens=False), 2]
    parsed = [{"name": "f", "arguments": {"x": "é"}, "id": "call_1_0"}]
    assert renderer.format_text_calls(parsed) == f'[TOOL_CALLS][{{"name": "f", "arguments": {{"x": "é"}}, "id": "{mistral_call_id("call_1_0")}"}}]'


@pytest.fixture(scope="module")
def vllm_tokenizer() -> Any:
    """vLLM's MistralTokenizer, built as vLLM builds it (MistralCommonBackend in test mode),
    from the tekken file: offline."""
    from vllm.tokenizers.mistral import MistralTokenizer as VllmMistralTokenizer

    return VllmMistralTokenizer(mistral_tokenizer())


@pytest.mark.parametrize("seed", SEEDS[:8])
def test_vllm_and_our_parser_agree(renderer: MistralRenderer, vllm_tokenizer: Any, seed: int) -> None:
    msgs, tools, cuts = conversation(seed, engine_ids=True)
    ours = get_parser("mistral")
    theirs = get_parser("vllm:mistral", tokenizer=vllm_tokenizer, tools=tools)
    for cut in cuts:
        _, before = renderer.render(msgs[: cut - 1], tools)
        _, after = renderer.render(msgs[:cut], tools, add_generation_prompt=False)
        text = renderer.decode(after[len(before):-1])  # the turn the model wrote, without its </s>
        a, b = ours.parse(text), theirs.parse(text)
        assert not a.errors and not b.errors
        want = [(c["function"]["name"], c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
                 else json.loads(c["function"]["arguments"])) for c in msgs[cut - 1]["tool_calls"]]
        assert [(c.name, c.arguments) for c in a.tool_calls] == want
        assert [(c.name, c.arguments) for c in b.tool_calls] == want
        assert [c.id for c in a.tool_calls] == [mistral_call_id(c["id"]) for c in msgs[cut - 1]["tool_calls"]]


# ---- refusals ------------------------------------------------------------------------------------


def _call_msg(content: Any = "", args: Any = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": "call_1_0", "type": "function", "function": {"name": "f", "arguments": {} if args is None else args}}]}


@pytest.mark.parametrize(("messages", "match"), [
    ([{"role": "robot", "content": "x"}], "role 'robot'"),
    ([{"content": "x"}], "role None"),
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "user", "content": "u"}, "oops"], "message 1 is str"),
    ([{"role": "user", "content": "u"}, _call_msg("I will call f")], "both text and tool calls"),
    ([{"role": "user", "content": "u"}, _call_msg(args='{"a": ')], "arguments are not valid JSON"),
    ([{"role": "user", "content": "u"}, _call_msg(args="[1, 2]")], "must be a JSON object, got an array"),
    ([{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": "f()"}], "must be a list"),
    ([{"role": "tool", "content": "r", "tool_call_id": "abcdefghi"}], "must start with a user message or system"),
    ([{"role": "user", "content": "u"}, {"role": "tool", "content": "r"}], "no call left to answer"),
])
def test_clear_errors(renderer: MistralRenderer, messages: Any, match: str) -> None:
    with pytest.raises(MistralRenderError, match=match) as e:
        renderer.render(messages, None)
    assert isinstance(e.value, UserError) and isinstance(e.value, RenderError)


def test_text_with_calls_dropped_on_request(oracle_tok: dict) -> None:
    dropping = MistralRenderer(text_with_calls="drop")
    msgs = [{"role": "user", "content": "u"}, _call_msg("I will call f"), {"role": "tool", "tool_call_id": "call_1_0", "content": "r"}]
    r = dropping.render_detailed(msgs, None)
    assert any("dropped" in n for n in r.notes)
    assert r.token_ids == oracle_ids(oracle_tok, [msgs[0], _call_msg(""), msgs[2]], [], r.id_map)
    with pytest.raises(MistralRenderError, match="'error' or 'drop'"):
        MistralRenderer(text_with_calls="keep")  # type: ignore[arg-type]


def test_reasoning_and_unknown_kwargs_are_noted(renderer: MistralRenderer, oracle_tok: dict) -> None:
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "reasoning_content": "hmm"},
            {"role": "user", "content": "v"}]
    r = renderer.render_detailed(msgs, None, kwargs={"enable_thinking": False})
    assert r.token_ids == oracle_ids(oracle_tok, [msgs[0], {"role": "assistant", "content": "a"}, msgs[2]], [])
    assert any("reasoning_content dropped" in n for n in r.notes) and any("ignored enable_thinking" in n for n in r.notes)
    with pytest.raises(MistralRenderError, match="true or false"):
        renderer.render(msgs, None, kwargs={"continue_final_message": "yes"})


def test_tool_turn_needs_messages(renderer: MistralRenderer) -> None:
    with pytest.raises(MistralRenderError, match="at least one new message"):
        renderer.tool_turn([{"role": "user", "content": "u"}], [], None)
    with pytest.raises(MistralRenderError, match="history"):
        renderer.tool_turn([], [{"role": "user", "content": "u"}], None)
    with pytest.raises(MistralRenderError, match="tools must be a list"):
        renderer.render([{"role": "user", "content": "u"}], [{"name": "f"}])
