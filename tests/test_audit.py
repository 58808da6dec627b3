"""The re-render audit (backend.checks.audit, CLI ``audit``): whether a full re-render of a rollout's
messages gives the ids the model was shown. The oracle for "breaks" is transformers' own
``apply_chat_template`` of the final messages, compared here with the loop's ids directly."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from cli_inprocess import run_cli

from backend.checks.audit import AuditReport, audit, audit_trace
from backend.config import LoopConfig
from backend.engine import AgentLoop
from backend.generators.scripted import ScriptedGenerator
from backend.loading.tokenizers import load_tokenizer
from backend.tools import ToolRegistry
from backend.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
SEATTLE = [{"role": "user", "content": "What's the weather in Seattle?"}]
CALL = '<tool_call>\n{"name": "get_current_temperature", "arguments": {"city": "Seattle"}}\n</tool_call>'
TOOL = {"type": "function", "function": {"name": "get_current_temperature", "description": "d", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}, "mock": "22"}


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("qwen3")


def run(bundle, script, mode="continuous") -> Trace:
    gen = ScriptedGenerator(bundle.tokenizer, script)
    return asyncio.run(AgentLoop(gen, bundle, tools=ToolRegistry.from_schemas([TOOL]),
                                 config=LoopConfig(tool_turns=mode)).run(SEATTLE))


def oracle_breaks(bundle, t: Trace) -> bool:
    full = list(bundle.tokenizer.apply_chat_template(t.messages, tools=[{k: v for k, v in TOOL.items() if k != "mock"}],
                                                     tokenize=True, return_dict=False, chat_template=bundle.chat_template))
    ids = t.input_ids
    return not (full[: len(ids)] == ids and not bundle.tokenizer.decode(full[len(ids):]).strip())


def test_continuous_rollouts_do_not_break_legacy_ones_do(qwen3):
    cont = run(qwen3, [CALL, CALL, "done"])
    legacy = run(qwen3, [CALL, CALL, "done"], "legacy")
    a, b = audit_trace(cont, qwen3), audit_trace(legacy, qwen3)
    assert (a.broken, b.broken) == (oracle_breaks(qwen3, cont), oracle_breaks(qwen3, legacy)) == (False, True)
    assert a.trailing and b.trailing  # the '\n' after the last turn: counted apart, not a break
    bounds = [s.start for s in legacy.steps if s.state == "processing_tools"]
    assert [d.position for d in b.differences] == bounds and b.causes == {"turn_separator": 2}
    assert b.turns == [1, 2]  # the separator after assistant turn 1, then 2


def test_report_counts_rollouts_by_cause(qwen3):
    traces = [run(qwen3, [CALL, "done"]), run(qwen3, [CALL, "done"], "legacy"), run(qwen3, [CALL, "done"], "legacy")]
    # DeepSeek V3's template drops the reasoning of earlier turns on re-render
    ds = load_tokenizer("deepseek-v3")
    from tests.test_families import QUESTION, script_for

    gen = ScriptedGenerator(ds.tokenizer, script_for("deepseek-v3", ds), stop_token_ids=ds.stop_token_ids, encode=ds.encode_generated)
    t2 = asyncio.run(AgentLoop(gen, ds, tools=ToolRegistry.from_schemas([TOOL]), config=LoopConfig()).run(QUESTION))
    bundles = {id(x): qwen3 for x in traces}
    rep = audit([*traces, t2], lambda tr: bundles.get(id(tr), ds))
    assert isinstance(rep, AuditReport) and len(rep.traces) == 4
    assert [x.broken for x in rep.traces] == [oracle_breaks(qwen3, x) for x in traces] + [True]
    bc = rep.by_cause()
    assert bc["turn_separator"] == 2 and bc.get("reasoning_stripped", 0) >= 1
    assert rep.sentence().startswith("3 of 4 rollouts break under a full re-render: 2 turn separator dropped")


def test_traces_that_cannot_be_audited_are_listed(qwen3):
    no_ids = Trace(messages=SEATTLE, id="text-only")
    rep = audit([no_ids, run(qwen3, [CALL, "done"])], lambda tr: qwen3)
    assert rep.traces[0].error and "no token ids" in rep.traces[0].error and not rep.traces[0].broken
    rep2 = audit([run(qwen3, [CALL, "done"])], lambda tr: "token-level checks skipped: no tokenizer")
    assert rep2.traces[0].error == "token-level checks skipped: no tokenizer"
    assert "not audited" in rep.sentence()


@pytest.mark.slow  # ≥ 10 s here (scripts/test_durations.py): out of the edit loop, in CI
def test_cli_audit(qwen3, tmp_path):
    f = tmp_path / "rollouts.jsonl"
    traces = [run(qwen3, [CALL, "done"]), run(qwen3, [CALL, "done"], "legacy")]
    f.write_text("".join(t.to_json() + "\n" for t in traces) + "not json\n")
    p = run_cli("audit", str(f), "--json")
    assert p.returncode == 1, p.stderr  # one bad record: listed, the rest audited
    out = json.loads(p.stdout)
    assert out["traces"] == 2 and out["broken"] == 1 and out["by_cause"] == {"turn_separator": 1}
    assert len(out["problems"]) == 1 and out["problems"][0]["line"] == 3
    assert [r["broken"] for r in out["rollouts"]] == [oracle_breaks(qwen3, t) for t in traces]
    p = run_cli("audit", str(ROOT / "sample_traces"), "--rollouts")
    assert p.returncode == 0 and "rollouts break under a full re-render" in p.stdout and "by cause" in p.stdout, p.stderr
    p = run_cli("audit", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and p.stderr.startswith("error:") and "Traceback" not in p.stderr
