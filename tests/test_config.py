"""The loop settings' one table (backend.config.FIELDS): every LoopConfig field declares its Knob,
and the validation, the trust ranges, the CLI flags and the Playground widgets are all derived
from it, so a new knob is one field in backend/config.py."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from backend import config
from backend.config import FIELDS, ConfigError, LoopConfig, default_tool_choice, runs_embedded_model, tool_choice_label
from backend.errors import UserError


def test_the_table_covers_every_field_in_order():
    assert list(FIELDS) == [f.name for f in dataclasses.fields(LoopConfig)]
    for name, k in FIELDS.items():
        assert k.kind in ("int", "float", "choice", "object", "parser", "tool_choice"), name
        assert k.label and k.help, name
        assert k.flag(name) == "--" + name.replace("_", "-")
        if k.kind == "choice":
            assert getattr(LoopConfig(), name) in k.choices
    assert issubclass(ConfigError, UserError)


def test_validation_comes_from_the_table():
    for name, k in FIELDS.items():
        if k.positive:
            with pytest.raises(ConfigError, match=name):
                LoopConfig(**{name: 0})
            if k.optional:
                assert getattr(LoopConfig(**{name: None}), name) is None
            else:
                with pytest.raises(ConfigError, match=name):
                    LoopConfig(**{name: None})
        if k.kind == "choice":
            with pytest.raises(ConfigError, match=name):
                LoopConfig(**{name: "no-such-choice"})
        if k.kind == "object":
            with pytest.raises(ConfigError, match=name):
                LoopConfig(**{name: [1]})
    with pytest.raises(ConfigError, match="unknown sampling"):
        LoopConfig(sampling={"temprature": 1})
    with pytest.raises(ConfigError):
        LoopConfig(tool_choice="")


def test_trust_ranges_come_from_the_table():
    from backend.safety.trust import RANGES

    with_range = {n for n, k in FIELDS.items() if k.visitor_max is not None}
    # every number a visitor can send is bounded on a public server
    assert with_range == {n for n, k in FIELDS.items() if k.kind in ("int", "float")} and "response_length" in with_range
    for n in with_range:
        k = FIELDS[n]
        r = RANGES[n]
        assert (r.lo, r.hi, r.integer, r.zero_means_none) == (k.visitor_min, k.visitor_max, k.kind == "int", k.optional)


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {opt: a.dest for a in parser._actions for opt in a.option_strings}


@pytest.mark.parametrize("command", ["run", "rollout"])
def test_cli_flags_come_from_the_table(command):
    from backend.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = _flags(sub.choices[command])
    for name, k in FIELDS.items():
        assert flags.get(k.flag(name)) == name, (command, name)


def test_cli_loop_config_reads_flags_file_and_env(tmp_path, monkeypatch):
    from backend.cli import CLIError, loop_config

    cfg_file = tmp_path / "c.json"
    cfg_file.write_text('{"max_parallel_calls": 3, "response_length": 100}')
    ns = argparse.Namespace(config=str(cfg_file), **{n: None for n in FIELDS})
    ns.response_length = "200"
    ns.max_assistant_turns = "0"  # 0 = no limit, as in the Playground
    ns.apply_chat_template_kwargs = '{"enable_thinking": false}'
    cfg, given = loop_config(ns)
    assert (cfg.response_length, cfg.max_parallel_calls, cfg.max_assistant_turns) == (200, 3, None)
    assert cfg.apply_chat_template_kwargs == {"enable_thinking": False}
    ns.sampling = "{"
    with pytest.raises(CLIError, match="--sampling"):
        loop_config(ns)
    # a field's ALI_* variable (none of today's fields has one: give one to a field for the test)
    monkeypatch.setitem(config.FIELDS, "max_user_turns", dataclasses.replace(FIELDS["max_user_turns"], env="ALI_TEST_MAX_USER_TURNS"))
    monkeypatch.setenv("ALI_TEST_MAX_USER_TURNS", "7")
    cfg, _ = loop_config(argparse.Namespace(config=None, **{n: None for n in FIELDS}))
    assert cfg.max_user_turns == 7


def test_playground_widgets_and_settings_come_from_the_table():
    import ui
    from ui import playground
    from ui.context import AppContext

    assert playground.LOOP_WIDGETS == [n for n in FIELDS if n != "sampling"]
    names = playground.setting_names()
    assert all(n in names for n in playground.LOOP_WIDGETS)
    demo = ui.build_app(AppContext())
    by_id = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    defaults = LoopConfig()
    for n in playground.LOOP_WIDGETS:
        k = FIELDS[n]
        w = by_id[k.elem_id]
        assert w.label == k.label, n
        if k.kind == "choice":
            assert [c[1] for c in w.choices] == list(k.choices), n
        # the widget's default is the field's default, read back through the Knob
        if n != "tool_choice":  # the app's default policy (default_tool_choice) may differ from LoopConfig's
            assert k.parse(getattr(playground.RunSettings(), n)) == getattr(defaults, n), n


def test_playground_settings_object_is_checked_against_the_table():
    from ui.playground import settings_from_dict

    s = settings_from_dict({"max_parallel_calls": 2, "tool_choice": "required, then auto"})
    assert s.max_parallel_calls == 2 and s.response_length == 4096
    with pytest.raises(UserError, match="unknown key"):
        settings_from_dict({"max_turns": 3})
    with pytest.raises(UserError):
        settings_from_dict(["not", "an", "object"])


def test_default_tool_choice_and_embedded_model_in_one_place():
    assert default_tool_choice(embedded_model=True) == "required, then auto"
    assert default_tool_choice(embedded_model=False) == "auto"
    assert tool_choice_label(("none",)) == "none" and tool_choice_label(["get_weather", "auto"]) == "get_weather, then auto"
    assert runs_embedded_model("vllm", None) and runs_embedded_model("transformers", "")
    assert not runs_embedded_model("vllm", "Qwen/Qwen3-0.6B") and not runs_embedded_model("vllm-server", None)
    assert not runs_embedded_model("scripted", None) and not runs_embedded_model(None, None)
