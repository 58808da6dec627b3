"""Make the LangSmith fixture files in tests/data/import/langsmith/ with the real SDK.

    python3 -m venv /work/fixenv/langsmith
    /work/fixenv/langsmith/bin/pip install -r tests/fixtures_gen/requirements-langsmith.txt
    /work/fixenv/langsmith/bin/python tests/fixtures_gen/gen_langsmith.py

Offline: one stdlib HTTP server on 127.0.0.1 plays both sides. It answers
``/v1/chat/completions`` from the scenario (scenario_langsmith_mlflow.py), and it is the
LangSmith API the SDK traces to (``LANGSMITH_ENDPOINT``): ``GET /info``, then the batch ingest
``POST /runs/multipart`` (also ``/runs/batch`` and ``POST /runs`` + ``PATCH /runs/{id}``, should
the SDK fall back to them). The runs it receives are saved as the SDK sent them: a multipart
operation's parts (``post.{id}``, ``post.{id}.inputs``, ``.outputs``, ``.events``, ``.extra``)
joined into one run object, one operation per line.

Files:

* ``runs.jsonl`` — ``@traceable`` agent loop (a ``chain`` run) around a ``wrap_openai`` client
  (``llm`` runs, OpenAI-style ``inputs.messages`` / ``outputs.choices``) and ``@traceable``
  tools (``tool`` runs): the three conversations of the scenario, one run per line;
* ``run_trees.jsonl`` — the same three traces as nested run trees (``RunTree`` from the
  ``on_end`` hook, each run's ``model_dump(mode="json")`` with its ``child_runs``), one per line;
* ``langchain_runs.jsonl`` — LangChain's ``ChatOpenAI.bind_tools`` + ``StructuredTool``s under a
  ``@traceable`` root, traced by LangChain's tracer: ``llm`` runs with LangChain-serialised
  messages (``inputs.messages`` = ``[[{"lc": 1, "type": "constructor", ...}]]``,
  ``outputs.generations``), tool runs whose outputs are ``ToolMessage``s; one run per line;
* ``wrapped_tools.jsonl`` — the ``runs.jsonl`` agent again with its tools run through one generic
  ``@traceable(run_type="tool", name="call_tool")`` wrapper taking ``name`` and ``arguments``
  (tool runs named ``call_tool``, inputs ``{"name", "arguments"}``), the conversations with
  tools, one run per line (written alone by ``gen_langsmith.py wrapped_tools``).
"""

from __future__ import annotations

import email
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenario_langsmith_mlflow as sc  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "data" / "import" / "langsmith"

INFO = {
    "version": "0.0.0-fixture",
    "batch_ingest_config": {
        "use_multipart_endpoint": True, "scale_up_qsize_trigger": 1000, "scale_up_nthreads_limit": 1,
        "scale_down_nempty_trigger": 4, "size_limit": 100, "size_limit_bytes": 20_971_520,
    },
}


class Server:
    """The fake model and the fake LangSmith API, with what LangSmith received."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []  # operations as received, in order
        self.lock = threading.Lock()
        self.n = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, obj: Any, code: int = 200) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def do_GET(self) -> None:
                self._send(INFO if self.path.rstrip("/").endswith("/info") else {})

            def do_POST(self) -> None:
                body = self._body()
                path = self.path.split("?")[0]
                if path.endswith("/chat/completions"):
                    req = json.loads(body)
                    with outer.lock:
                        outer.n += 1
                        n = outer.n
                    self._send(sc.completion_json(req["messages"], n))
                elif path.endswith("/runs/multipart"):
                    outer.take_multipart(self.headers.get("Content-Type", ""), body)
                    self._send({})
                elif path.endswith("/runs/batch"):
                    doc = json.loads(body)
                    with outer.lock:
                        outer.runs.extend(doc.get("post") or [])
                        outer.runs.extend(doc.get("patch") or [])
                    self._send({})
                elif path.endswith("/runs"):
                    with outer.lock:
                        outer.runs.append(json.loads(body))
                    self._send({})
                else:
                    self._send({})

            def do_PATCH(self) -> None:
                body = self._body()
                run = json.loads(body)
                run.setdefault("id", self.path.rstrip("/").rsplit("/", 1)[-1])
                with outer.lock:
                    outer.runs.append(run)
                self._send({})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def take_multipart(self, content_type: str, body: bytes) -> None:
        """``post.{id}`` / ``patch.{id}`` parts and their ``.inputs`` / ``.outputs`` / ``.events``
        / ``.extra`` parts → one run object per operation, in the order of the parts."""
        msg = email.message_from_bytes(b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
        ops: dict[tuple[str, str], dict[str, Any]] = {}
        for part in msg.get_payload():
            name = part.get_param("name", header="content-disposition")
            op, rid, *field = name.split(".")
            if op not in ("post", "patch"):
                continue  # attachments, feedback: not in this scenario
            data = json.loads(part.get_payload(decode=True))
            run = ops.setdefault((op, rid), {})
            if field:
                run[field[0]] = data
            else:
                run.update(data)
        with self.lock:
            self.runs.extend(ops.values())


def tree_dict(rt: Any) -> dict[str, Any]:
    """A RunTree with its children (``child_runs`` is excluded from the model's own dump)."""
    d = rt.model_dump(mode="json")
    d["child_runs"] = [tree_dict(c) for c in rt.child_runs]
    return d


def first_messages(system: str | None, user: str) -> list[dict[str, Any]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def write_jsonl(path: Path, rows: list[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(rows)} lines, {path.stat().st_size} bytes)")


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    srv = Server()
    os.environ.update(LANGSMITH_ENDPOINT=srv.url, LANGSMITH_API_KEY="fixture-key", LANGSMITH_TRACING="true",
                      LANGSMITH_PROJECT="fixtures", OPENAI_API_KEY="fixture-key")
    import langsmith
    import openai
    from langsmith import Client, traceable
    from langsmith.wrappers import wrap_openai

    client = Client(api_url=srv.url, api_key="fixture-key")
    oa = wrap_openai(openai.OpenAI(base_url=srv.url + "/v1", api_key="fixture-key"))
    tools = {name: traceable(run_type="tool", name=name, client=client)(fn) for name, fn in sc.TOOL_FUNCTIONS.items()}

    @traceable(name="travel_agent", client=client)
    def run_agent(system: str | None, user: str, with_tools: bool, max_llm_calls: int = 10) -> str | None:
        msgs = first_messages(system, user)
        for _ in range(max_llm_calls):
            kw = {"tools": sc.TOOLS} if with_tools else {}
            # a copy: the run keeps a reference to what it was given, and the loop goes on appending
            m = oa.chat.completions.create(model=sc.MODEL, messages=list(msgs), **kw).choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                return m.content
            for c in m.tool_calls:
                out = tools[c.function.name](**json.loads(c.function.arguments))
                msgs.append({"role": "tool", "tool_call_id": c.id, "content": out})
        return None  # stopped at the limit

    if argv == ["wrapped_tools"]:
        @traceable(run_type="tool", name="call_tool", client=client)
        def call_tool(name: str, arguments: dict[str, Any]) -> str:  # the app's one tool run: dispatches by name
            return sc.TOOL_FUNCTIONS[name](**arguments)

        @traceable(name="travel_agent", client=client)
        def run_wrapped(system: str | None, user: str, max_llm_calls: int = 10) -> str | None:
            msgs = first_messages(system, user)
            for _ in range(max_llm_calls):
                m = oa.chat.completions.create(model=sc.MODEL, messages=list(msgs), tools=sc.TOOLS).choices[0].message
                msgs.append(m.model_dump(exclude_none=True))
                if not m.tool_calls:
                    return m.content
                for c in m.tool_calls:
                    msgs.append({"role": "tool", "tool_call_id": c.id, "content": call_tool(name=c.function.name, arguments=json.loads(c.function.arguments))})
            return None

        for conv in sc.CONVERSATIONS:
            if conv["tools"]:
                run_wrapped(conv["system"], conv["user"], conv.get("max_llm_calls", 10))
        client.flush()
        write_jsonl(OUT / "wrapped_tools.jsonl", srv.runs)
        srv.httpd.shutdown()
        return

    trees: list[Any] = []
    for conv in sc.CONVERSATIONS:
        run_agent(conv["system"], conv["user"], conv["tools"], conv.get("max_llm_calls", 10), langsmith_extra={"on_end": trees.append})
    client.flush()
    write_jsonl(OUT / "runs.jsonl", srv.runs)
    write_jsonl(OUT / "run_trees.jsonl", [tree_dict(t) for t in trees])
    srv.runs.clear()

    # LangChain: its tracer writes LangChain-serialised messages
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import StructuredTool
    from langchain_core.tracers.langchain import wait_for_all_tracers
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=sc.MODEL, base_url=srv.url + "/v1", api_key="fixture-key")
    lc_tools = {
        t["function"]["name"]: StructuredTool.from_function(
            sc.TOOL_FUNCTIONS[t["function"]["name"]], name=t["function"]["name"], description=t["function"]["description"])
        for t in sc.TOOLS
    }

    @traceable(name="travel_agent_langchain", client=client)
    def run_lc_agent(system: str | None, user: str, with_tools: bool, max_llm_calls: int = 10) -> str | None:
        msgs: list[Any] = ([SystemMessage(system)] if system else []) + [HumanMessage(user)]
        model = llm.bind_tools(sc.TOOLS) if with_tools else llm
        for _ in range(max_llm_calls):
            ai = model.invoke(list(msgs))
            msgs.append(ai)
            if not ai.tool_calls:
                return ai.content
            for call in ai.tool_calls:
                msgs.append(lc_tools[call["name"]].invoke(call))
        return None

    for conv in sc.CONVERSATIONS:
        run_lc_agent(conv["system"], conv["user"], conv["tools"], conv.get("max_llm_calls", 10))
    wait_for_all_tracers()
    client.flush()
    write_jsonl(OUT / "langchain_runs.jsonl", srv.runs)
    print("langsmith", langsmith.__version__)
    srv.httpd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
