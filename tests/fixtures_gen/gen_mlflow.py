"""Make the MLflow fixture files in tests/data/import/mlflow/ with the real library.

    python3 -m venv /work/fixenv/mlflow
    /work/fixenv/mlflow/bin/pip install -r tests/fixtures_gen/requirements-mlflow.txt
    /work/fixenv/mlflow/bin/python tests/fixtures_gen/gen_mlflow.py

Offline: ``mlflow-skinny`` traces into a ``file:`` tracking store in a temporary folder
(``MLFLOW_ALLOW_FILE_STORE=true``, ``MLFLOW_ENABLE_ASYNC_TRACE_LOGGING=false``);
``mlflow.openai.autolog()`` traces an ``openai`` client pointed at a stdlib HTTP server on
127.0.0.1 that answers ``/v1/chat/completions`` from the scenario
(scenario_langsmith_mlflow.py); the agent loop is an ``@mlflow.trace(span_type="AGENT")``
function and the tools ``@mlflow.trace(span_type="TOOL")`` functions. Each trace is read back
with ``mlflow.get_trace`` and written with ``Trace.to_json()``.

Files:

* ``traces.jsonl`` — the scenario's four conversations, one ``Trace.to_json()`` per line;
* ``trace_parallel.json`` — the parallel-calls conversation alone, ``to_json(pretty=True)``
  (a whole JSON file is one trace);
* ``responses.jsonl`` — the one-call conversation through ``client.responses.create`` (the
  server answers ``/v1/responses`` too): a chat span whose inputs are Responses ``input`` items
  and whose outputs are the ``Response`` with its ``output`` items;
* ``wrapped_tools.jsonl`` — the conversations with tools again, the tools run through one generic
  ``@mlflow.trace(name="call_tool", span_type="TOOL")`` wrapper taking ``name`` and ``arguments``
  (written alone by ``gen_mlflow.py wrapped_tools``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenario_langsmith_mlflow as sc  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "data" / "import" / "mlflow"


def serve() -> tuple[ThreadingHTTPServer, str]:
    lock = threading.Lock()
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(n))
            with lock:
                count[0] += 1
                k = count[0]
            if self.path.rstrip("/").endswith("/responses"):
                body = json.dumps(sc.responses_json(req["input"], k)).encode()
            else:
                body = json.dumps(sc.completion_json(req["messages"], k)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_port}"


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    store = tempfile.mkdtemp(prefix="mlflow-fixtures-")
    os.environ.update(MLFLOW_ALLOW_FILE_STORE="true", MLFLOW_ENABLE_ASYNC_TRACE_LOGGING="false",
                      MLFLOW_TRACKING_URI="file:" + store, OPENAI_API_KEY="fixture-key")
    httpd, url = serve()
    import mlflow
    import openai

    mlflow.set_tracking_uri("file:" + store)
    mlflow.set_experiment("fixtures")
    mlflow.openai.autolog()
    client = openai.OpenAI(base_url=url + "/v1", api_key="fixture-key")
    tools = {name: mlflow.trace(fn, name=name, span_type="TOOL") for name, fn in sc.TOOL_FUNCTIONS.items()}

    @mlflow.trace(name="travel_agent", span_type="AGENT")
    def run_agent(system: str | None, user: str, with_tools: bool, max_llm_calls: int = 10) -> str | None:
        msgs: list[dict[str, Any]] = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        for _ in range(max_llm_calls):
            kw = {"tools": sc.TOOLS} if with_tools else {}
            m = client.chat.completions.create(model=sc.MODEL, messages=list(msgs), **kw).choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                return m.content
            for c in m.tool_calls:
                out = tools[c.function.name](**json.loads(c.function.arguments))
                msgs.append({"role": "tool", "tool_call_id": c.id, "content": out})
        return None  # stopped at the limit

    if argv == ["wrapped_tools"]:
        @mlflow.trace(name="call_tool", span_type="TOOL")
        def call_tool(name: str, arguments: dict[str, Any]) -> str:  # the app's one tool span: dispatches by name
            return sc.TOOL_FUNCTIONS[name](**arguments)

        @mlflow.trace(name="travel_agent", span_type="AGENT")
        def run_wrapped(system: str | None, user: str, max_llm_calls: int = 10) -> str | None:
            msgs: list[dict[str, Any]] = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
            for _ in range(max_llm_calls):
                m = client.chat.completions.create(model=sc.MODEL, messages=list(msgs), tools=sc.TOOLS).choices[0].message
                msgs.append(m.model_dump(exclude_none=True))
                if not m.tool_calls:
                    return m.content
                for c in m.tool_calls:
                    msgs.append({"role": "tool", "tool_call_id": c.id, "content": call_tool(name=c.function.name, arguments=json.loads(c.function.arguments))})
            return None

        path = OUT / "wrapped_tools.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for conv in sc.CONVERSATIONS:
                if conv["tools"]:
                    run_wrapped(conv["system"], conv["user"], conv.get("max_llm_calls", 10))
                    t = mlflow.get_trace(mlflow.get_last_active_trace_id())
                    f.write(json.dumps(json.loads(t.to_json()), ensure_ascii=False) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)")
        httpd.shutdown()
        return

    traces = []
    for conv in sc.CONVERSATIONS:
        run_agent(conv["system"], conv["user"], conv["tools"], conv.get("max_llm_calls", 10))
        traces.append(mlflow.get_trace(mlflow.get_last_active_trace_id()))
    # the one_call conversation again, through the Responses API
    @mlflow.trace(name="travel_agent_responses", span_type="AGENT")
    def run_responses_agent(system: str, user: str) -> str | None:
        items: list[dict[str, Any]] = [{"role": "user", "content": user}]
        for _ in range(10):
            r = client.responses.create(model=sc.MODEL, instructions=system, input=list(items), tools=sc.RESPONSES_TOOLS)
            items.extend(o.model_dump(exclude_none=True) for o in r.output)
            calls = [o for o in r.output if o.type == "function_call"]
            if not calls:
                return r.output_text
            for c in calls:
                out = tools[c.name](**json.loads(c.arguments))
                items.append({"type": "function_call_output", "call_id": c.call_id, "output": out})
        return None

    one = next(c for c in sc.CONVERSATIONS if c["name"] == "one_call")
    run_responses_agent(one["system"], one["user"])
    responses_trace = mlflow.get_trace(mlflow.get_last_active_trace_id())
    path = OUT / "responses.jsonl"
    path.write_text(json.dumps(json.loads(responses_trace.to_json()), ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")

    path = OUT / "traces.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps(json.loads(t.to_json()), ensure_ascii=False) + "\n")
    print(f"wrote {path} ({len(traces)} lines, {path.stat().st_size} bytes)")
    parallel = next(t for t, c in zip(traces, sc.CONVERSATIONS) if c["name"] == "parallel_two_rounds")
    path = OUT / "trace_parallel.json"
    path.write_text(parallel.to_json(pretty=True) + "\n", encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    print("mlflow", mlflow.__version__)
    httpd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
