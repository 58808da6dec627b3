"""The capture gateway: an OpenAI-style HTTP endpoint in front of our generators that records what
any harness's model was shown and generated, token-exact, as a tree of branches per session.

What belongs here: the dialect adapters at the edge (one module per dialect: a request becomes
chat messages, tools and sampling; a turn becomes the dialect's response or its SSE events), the
session store (:mod:`backend.gateway.core`: which sampled turn a request extends, where and why it
forks, retries, capture files) and the HTTP app that serves them (:mod:`backend.gateway.server`).
What does not: rendering, the families' junction rules, parsing and generation (the token layer,
``backend.families``, ``backend.parsers``, ``backend.generators``, used as the agent loop uses
them), and the trace format (a branch is an ordinary ``Trace``)."""
