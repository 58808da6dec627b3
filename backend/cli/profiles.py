"""``profiles``: the offline profiles (model families) — vocabulary, template, EOS, tool-call format."""

from __future__ import annotations

from backend.cli import emit


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list the offline profiles: family, vocabulary, default template, EOS, format")
    p.add_argument("--json", action="store_true", help="print JSON (a list of objects)")
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.loading.tokenizers import describe_profiles

    rows = describe_profiles()
    lines = []
    for r in rows:
        src = r["vocabulary_source"]
        registry = "npm " if src.get("registry") == "npm" else ""
        limit = "; the template renders no tool turn" if r.get("tool_limit") else ""
        lines.append(f"{r['name']:<16} {r['family']:<12} format={r['format']:<12} template={r['template']:<28} "
                     f"eos={r['eos']}  ({registry}{src['package']} {src['version']}{limit})")
    emit(rows, args.json, "\n".join(lines))
    return 0
