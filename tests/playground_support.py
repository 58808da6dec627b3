"""Helpers the in-process Playground tests share (test_ui_app, test_ui_playground, test_trust):
a fresh session, run settings over the weather example, and a run collected to its end."""

from __future__ import annotations

import json

from ui import playground
from ui.context import AppContext, Session, new_session


def fresh(ctx: AppContext) -> Session:
    s = new_session(ctx)
    s.file_traces = [label for label, _ in ctx.samples]
    return s


def settings(**kw) -> playground.RunSettings:
    base = dict(script=json.dumps(playground.WEATHER_SCRIPT), tools=json.dumps(playground.WEATHER_TOOLS), token_delay=0.0)
    base.update(kw)
    return playground.RunSettings(**base)


async def run_all(ctx, sess, text, s):
    return [item async for item in playground.run_turn(ctx, sess, text, s)]
