"""Agent Lightning rollout events written by Agent Lightning's own server (agentlightning 1.0.2), offline.

Run (from the repository root; the venv is described in requirements-agentlightning.txt):

    /work/fixenv/agl/bin/python tests/fixtures_gen/gen_agentlightning.py

It starts Agent Lightning's server (``agentlightning.server.app.create_app``, its in-memory store,
its rollout/event routes and its LLM proxy) under uvicorn on the loopback interface, registers a
model server, enqueues rollouts (two samples of each prompt, as the trainer does, with the
prompt's ``data_id`` in the input), and runs a small agent whose chat-completions calls go
through the server's proxy (``/proxy/rollout/{id}/attempt/0/mode/train/openai/v1/...``): the
proxy adds ``return_token_ids`` / ``logprobs`` and records each call as a ``model_request``
event. The agent runs the tools, posts a ``reward`` event and marks the rollout succeeded. Then
the files are the server's answers, byte for byte:

* ``events/<rollout_id>.json`` — ``GET /api/rollouts/{id}/events`` (every event, the full
  request/response of each model call);
* ``triplet/<rollout_id>.json`` — ``GET /api/rollouts/{id}/events?format=triplet`` (model calls
  trimmed to ``prompt_token_ids`` / ``response_token_ids`` / ``response_log_probs``, deduplicated
  by prompt, rewards to their value);
* ``rollouts.json`` — ``GET /api/rollouts?state_in=succeeded`` (the rollout records);
* ``run.jsonl`` — the elements of ``rollouts.json`` and of every ``events/`` answer, one JSON
  value per line (a run's records as one file).

What is not Agent Lightning's: the model server. vLLM is replaced by a scripted OpenAI-compatible
server (:func:`model_app`): the prompt is rendered with the Qwen3 chat template and tokenized,
the reply comes from :data:`SCRIPT`, its ids are the text's plus the EOS, its logprobs are
made up, and the body has vLLM's shape (``prompt_token_ids``, ``choices[0].token_ids``,
``choices[0].logprobs.content``, tool calls parsed as vLLM's ``hermes`` parser does). The
tokenizer is the one the app builds offline (saved by the app's venv into a temp folder).

Scenario: ``w-*`` — a weather question answered after one tool call (the second request's
prompt extends the first call's prompt + response); ``m-*`` — a sum, one turn; ``w-1`` also
sends one request the scripted server refuses (HTTP 400: an error event) before retrying;
``s-0`` — an agent that starts a new conversation for its second call (the prompt does not
extend the first: two separate turns)."""


import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time

from gen_skyrl import call, qwen3_tokenizer_dir  # the same offline tokenizer and Hermes call text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "import", "agentlightning")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
WEATHER_Q = "Is it raining in Zürich?"
MATH_Q = "What is 17 + 25? Answer with the number."
SUMMARY_Q = "Summarise: the trip to 東京 was sunny."
WEATHER = {"Zürich": "Zürich: 18°C, light rain"}




# (data_id, sample) -> the model's turns, in order
SCRIPT: dict[tuple[str, int], list[str]] = {
    ("w", 0): ["Let me check.\n" + call("get_weather", {"city": "Zürich"}), "Yes, light rain at 18°C."],
    ("w", 1): [call("get_weather", {"city": "Zürich"}), "No rain today."],
    ("m", 0): ["42"],
    ("m", 1): ["17 + 25 = 43"],
    ("s", 0): ["A sunny trip to 東京.", "Sunny 東京 trip."],
}
REWARDS = {("w", 0): 1.0, ("w", 1): 0.0, ("m", 0): 1.0, ("m", 1): 0.0, ("s", 0): 0.5}
INPUTS = {"w": WEATHER_Q, "m": MATH_Q, "s": SUMMARY_Q}




def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_app(tok):
    """A scripted vLLM-like OpenAI server: chat completions with token ids and logprobs."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI()
    refused: set[str] = set()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        messages = body["messages"]
        key = tuple(body["metadata"]["script"])
        if body["metadata"].get("refuse_once") and key[:2] not in refused:
            refused.add(key[:2])
            return JSONResponse({"error": {"message": "scripted refusal: max_tokens too large", "type": "BadRequestError",
                                           "code": 400}}, status_code=400)
        text = tok.apply_chat_template(messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=False)
        prompt_ids = tok.encode(text, add_special_tokens=False)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        reply = SCRIPT[(key[0], key[1])][turn if key[0] != "s" else key[2]]
        ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
        lps = [round(-0.05 * ((7 * k + len(prompt_ids)) % 11) - 0.0001 * k, 6) for k in range(len(ids))]
        content, calls = reply, []
        if "<tool_call>" in reply:
            head, _, rest = reply.partition("<tool_call>")
            content = head.strip() or None
            for n, chunk in enumerate(("<tool_call>" + rest).split("<tool_call>")[1:]):
                obj = json.loads(chunk.split("</tool_call>")[0])
                calls.append({"id": f"chatcmpl-tool-{key[0]}{key[1]}{turn}{n}", "type": "function",
                              "function": {"name": obj["name"], "arguments": json.dumps(obj["arguments"], ensure_ascii=False)}})
        message = {"role": "assistant", "content": content, "tool_calls": calls, "reasoning_content": None}
        logprobs = {"content": [{"token": tok.convert_ids_to_tokens(t), "logprob": lp, "bytes": None, "top_logprobs": []}
                                for t, lp in zip(ids, lps)]}
        return {
            "id": f"chatcmpl-{key[0]}{key[1]}{turn}", "object": "chat.completion", "created": 1764300000, "model": body["model"],
            "choices": [{"index": 0, "message": message, "logprobs": logprobs if body.get("logprobs") else None,
                         "finish_reason": "tool_calls" if calls else "stop", "stop_reason": None, "token_ids": ids}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids), "total_tokens": len(prompt_ids) + len(ids)},
            "prompt_token_ids": prompt_ids,
        }

    return app


def serve(app, port: int):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(200):
        if server.started:
            return server
        time.sleep(0.05)
    raise RuntimeError("server did not start")


def run_agent(client, rid: str, data_id: str, sample: int) -> None:
    """The agent: chat through Agent Lightning's proxy, run tools, report the reward."""
    url = f"/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions"
    client.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "0"}}).raise_for_status()
    messages = [{"role": "user", "content": INPUTS[data_id]}]
    meta = {"script": [data_id, sample, 0]}
    if data_id == "w" and sample == 1:
        meta["refuse_once"] = True
        r = client.post(url, json={"messages": messages, "tools": TOOLS, "metadata": meta})
        assert r.status_code == 400, r.text
    for turn in range(3):
        body = {"messages": messages, "metadata": {**meta, "script": [data_id, sample, turn]}}
        if data_id == "w":
            body["tools"] = TOOLS
        r = client.post(url, json=body)
        r.raise_for_status()
        msg = r.json()["choices"][0]["message"]
        if data_id == "s" and turn == 0:  # a fresh conversation for the second call
            messages = [{"role": "user", "content": "Shorter: " + msg["content"]}]
            continue
        if not msg.get("tool_calls"):
            break
        messages.append({"role": "assistant", "content": msg["content"] or "", "tool_calls": msg["tool_calls"]})
        for c in msg["tool_calls"]:
            args = json.loads(c["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": WEATHER[args["city"]]})
    if data_id == "s":
        client.post(f"/api/rollouts/{rid}/attempt/0/events", json={"event_type": "agent_note", "data": {"note": "restarted the conversation"}}).raise_for_status()
    client.post(f"/api/rollouts/{rid}/attempt/0/events", json={
        "event_type": "reward", "data": {"value": REWARDS[(data_id, sample)], "source": "agent", "message": "scripted grader"}}).raise_for_status()
    client.patch(f"/api/rollouts/{rid}", json={"status": {"state": "succeeded"}}).raise_for_status()


def main() -> None:
    import httpx
    from agentlightning.server.app import create_app
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tok = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir(os.path.join(tmp, "tok")))
        mport, aport = free_port(), free_port()
        servers = [serve(model_app(tok), mport)]
        config = {"key": "", "default_proxy": {"model_name": "qwen3-scripted", "train": {"temperature": 1.0},
                                               "val": {"temperature": 0.0}, "include_log_probs": True}}
        servers.append(serve(create_app(config), aport))
        client = httpx.Client(base_url=f"http://127.0.0.1:{aport}", timeout=30)
        client.post("/api/models", json=[{"model": "qwen3-scripted", "endpoint": f"http://127.0.0.1:{mport}/v1", "version": 3}]).raise_for_status()
        plan = [("w", 0), ("w", 1), ("m", 0), ("m", 1), ("s", 0)]
        rids = [f"ro-{d}-{s}" for d, s in plan]
        create = [{"input": {"data_id": d, "prompt": INPUTS[d]}, "is_train": True, "metadata": {}, "rollout_id": rid}
                  for (d, s), rid in zip(plan, rids)]
        client.post("/api/rollouts", json=create).raise_for_status()
        for (d, s), rid in zip(plan, rids):
            run_agent(client, rid, d, s)

        shutil.rmtree(OUT, ignore_errors=True)
        for sub in ("events", "triplet"):
            os.makedirs(os.path.join(OUT, sub))
        lines: list[str] = []
        r = client.get("/api/rollouts", params={"state_in": "succeeded"})
        r.raise_for_status()
        with open(os.path.join(OUT, "rollouts.json"), "wb") as f:
            f.write(r.content)
        lines += [json.dumps(x, ensure_ascii=False) for x in r.json()]
        for rid in rids:
            for sub, params in (("events", {}), ("triplet", {"format": "triplet"})):
                r = client.get(f"/api/rollouts/{rid}/events", params=params)
                r.raise_for_status()
                with open(os.path.join(OUT, sub, f"{rid}.json"), "wb") as f:
                    f.write(r.content)  # the server's answer, as sent
                if sub == "events":
                    lines += [json.dumps(x, ensure_ascii=False) for x in r.json()]
        with open(os.path.join(OUT, "run.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        for s in servers:
            s.should_exit = True
        print("wrote", OUT, sorted(os.listdir(os.path.join(OUT, "events"))))


if __name__ == "__main__":
    sys.exit(main())
