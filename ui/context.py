"""What the app shares between sessions (read-only configuration, the lazily started model,
cached tokenizers, the sample traces) and what each browser session owns (:class:`Session`).

Sharing rules: a :class:`Trace` is never mutated after it is built, so sample traces can be
shown to every session; everything a user does (uploads, runs, selections, the cancel event of
a run) lives in that user's :class:`Session`, kept in a ``gr.State``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.config import default_tool_choice, runs_embedded_model
from backend.errors import UserError  # the UI modules import it from here too
from backend.safety.trust import LOCAL, TrustPolicy
from backend.trace import Trace

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_DIR = ROOT / "sample_traces"


def trace_file_name(trace: Trace, ext: str = "jsonl") -> str:
    """A download's file name for a trace: its id reduced to ``[A-Za-z0-9._-]`` (ids come from
    files: a ``/`` or ``..`` in one must not pick the folder the file is written to)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", trace.id or "").strip("._")[:80] or "trace"
    return f"trace-{stem}.{ext}"


def short_error(e: BaseException) -> str:
    """One readable line for an exception (never a traceback)."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    name = type(e).__name__
    if isinstance(e, UserError):
        return msg or name
    # an unexpected error: its text may name the server's folders (a library's path in an
    # ImportError, a cache folder); a visitor sees only the last part of each path
    msg = _SERVER_PATH.sub(lambda m: "…/" + m.group(1), msg)
    return f"{name}: {msg}" if msg else name


_SERVER_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+-]+/)+([\w.@+-]*)")


@dataclass
class ModelOptions:
    backend: str  # vllm, vllm-server, transformers
    model: str | None = None
    server_urls: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    template: str | None = None
    engine_opts: dict[str, Any] = field(default_factory=dict)
    hardware: str | None = None  # backend.deploy.hardware.Hardware.describe(): what the backend was picked for
    scorer_device: str = "cpu"  # the logprob lens's forward pass (backend.deploy.hardware.Plan.scorer_device)

    def describe(self) -> str:
        what = self.model or ("the server's model" if self.backend == "vllm-server" else "SmolLM2-135M-Instruct (embedded)")
        s = f"{self.backend} · {what}"
        if self.server_urls:
            s += " · " + ", ".join(self.server_urls)
        shown = [f"{k} {v}" for k, v in self.engine_opts.items() if k in ("device", "dtype") and v is not None]
        if self.engine_opts.get("zerogpu"):
            shown.insert(0, "ZeroGPU")
        if shown:
            s += " · " + ", ".join(shown)
        return s


class ModelService:
    """The model backend, started on first use (the app opens instantly; browsing traces never
    needs a model). One generator serves all sessions: vLLM batches concurrent requests, and
    each run has its own cancel event."""

    def __init__(self, options: ModelOptions | None):
        self.options = options
        self._lock: asyncio.Lock | None = None
        self._state = "not started" if options else "disabled"
        self.profile_note: str | None = None  # how the operator's model's tokenizer / renderer was chosen
        self.generator: Any = None
        self.bundle: Any = None
        self.error: str | None = None
        self.load_seconds: float | None = None

    @property
    def available(self) -> bool:
        return self.options is not None

    def status(self) -> str:
        if self.options is None:
            return "no model (started with --no-model or the scripted backend)"
        if self.error:
            return f"failed to load: {self.error}"
        if self.generator is not None and self.load_seconds is not None:
            note = f"; {self.profile_note}" if self.profile_note else ""
            return f"ready ({self.options.describe()}, loaded in {self.load_seconds:.1f} s{note})"
        if self.generator is not None:  # built, the engine still starting
            return f"starting ({self.options.describe()})"
        return f"{self._state} ({self.options.describe()}); it starts on the first playground run"

    async def get(self) -> tuple[Any, Any]:
        """``(generator, tokenizer bundle)``; raises :class:`UserError` with a clear message."""
        if self.options is None:
            raise UserError("this app was started without a model (--no-model); use the scripted backend")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.generator is not None:
                return self.generator, self.bundle
            self._state = "loading"
            t0 = time.time()
            try:
                self.bundle, self.generator = await asyncio.to_thread(self._build)
                # the vLLM engine starts on its first request; warm it so the first run's
                # latency is the model's, and a start-up failure is reported here
                start = getattr(self.generator, "start", None)
                if callable(start):
                    r = start()
                    if asyncio.iscoroutine(r):
                        await r
            except Exception as e:  # noqa: BLE001 - shown to the user, kept for the log
                self.error = short_error(e)
                self.generator = None
                self._state = "failed"
                log.exception("could not load the model (%s)", self.options.describe())
                raise UserError(f"could not load the model ({self.options.describe()}): {self.error}") from None
            self.error = None
            self.load_seconds = time.time() - t0
            self._state = "ready"
            return self.generator, self.bundle

    def preload(self) -> None:
        """Build and load the model now, before the server starts (ZeroGPU moves the weights that
        are on the GPU when the app starts to each lent GPU slice). A failure is kept and shown
        as the model's status; the app still opens."""
        if self.options is None or self.generator is not None:
            return
        t0 = time.time()
        try:
            bundle, generator = self._build()
            load = getattr(generator, "load", None)
            if callable(load):
                load()
        except Exception as e:  # noqa: BLE001 - shown to the user, kept for the log
            self.error = short_error(e)
            self._state = "failed"
            log.exception("could not load the model (%s)", self.options.describe())
            return
        self.bundle, self.generator = bundle, generator
        self.error = None
        self.load_seconds = time.time() - t0
        self._state = "ready"

    def _build(self) -> tuple[Any, Any]:
        from backend.generators.factory import create_generator
        from backend.loading.tokenizers import load_model_tokenizer, load_tokenizer

        o = self.options
        assert o is not None
        if o.model and not o.tokenizer:  # the operator's model (ALI_MODEL): its profile by family
            bundle, self.profile_note = load_model_tokenizer(o.model, template=o.template)
            log.info("model tokenizer: %s", self.profile_note)
        else:
            bundle = load_tokenizer(o.tokenizer or o.model or "smollm2", template=o.template)
        gen = create_generator(o.backend, model=o.model, server_urls=o.server_urls, tokenizer=bundle, **o.engine_opts)
        return bundle, gen

    async def close(self) -> None:
        if self.generator is not None:
            await self.generator.close()


class TokenizerCache:
    """Tokenizer bundles by (name, template), loaded once, shared (they are read-only and the
    bundle carries its own lock for the engine). Bounded: the least recently used entry goes
    when more than ``max_entries`` are held (a template typed by a visitor is part of a key)."""

    def __init__(self, max_entries: int = 32) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str | None], Any] = OrderedDict()
        self.max_entries = max_entries

    def _key(self, name: str, template: str | None) -> tuple[str, str | None]:
        # long template texts are keyed by their digest, not held twice
        if template is not None and len(template) > 200:
            template = "sha256:" + hashlib.sha256(template.encode("utf-8", "surrogatepass")).hexdigest()
        return name, template

    def peek(self, name: str, template: str | None = None) -> Any | None:
        key = self._key(name, template)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
            return hit

    def put(self, name: str, template: str | None, bundle: Any) -> Any:
        key = self._key(name, template)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            self._cache[key] = bundle
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
            return bundle

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def get(self, name: str, template: str | None = None) -> Any:
        """Operator-level load (an offline profile, or what the operator named): a visitor's
        input goes through :meth:`AppContext.visitor_bundle` first."""
        from backend.loading.tokenizers import load_tokenizer

        hit = self.peek(name, template)
        if hit is not None:
            return hit
        return self.put(name, template, load_tokenizer(name, template=template))

    def loaded_named(self, name: str) -> Any | None:
        with self._lock:
            for (n, _), b in self._cache.items():
                if n == name:
                    return b
        return None


@dataclass
class AppContext:
    """Everything build_app needs; built by app.py from the command line."""

    model: ModelService = field(default_factory=lambda: ModelService(None))
    enable_code_tools: bool = False
    concurrency_limit: int = 4
    default_script: list[Any] | None = None
    default_tokenizer: str = "qwen3"
    samples: list[tuple[str, Trace]] = field(default_factory=list)
    sample_problems: list[str] = field(default_factory=list)
    tokenizers: TokenizerCache = field(default_factory=TokenizerCache)
    max_upload_bytes: int = 200 << 20
    # what visitor input may name (public or local mode), the number ranges, the run time limit
    trust: TrustPolicy = LOCAL
    # the operator's trace set (--traces / ALI_TRACES: a folder or glob), listed by the Trace files
    # tab and followed while written; the sets indexed, shared by the sessions (SetRegistry)
    traces: str | None = None
    trace_sets: Any = field(default_factory=lambda: _set_registry())
    # the capture gateway's folder (--gateway / --capture-dir): the Trace files tab's Captured sessions view
    capture_dir: str | None = None
    # the Playground's line of agent runs (ui/run_gate.RunGate), made when the app is built
    run_gate: Any = None

    def model_tokenizer_name(self) -> str | None:
        """The name the model's own tokenizer goes by (operator input), when there is a model."""
        o = self.model.options
        if o is None:
            return None
        return o.tokenizer or o.model or "smollm2"

    def visitor_bundle(self, tokenizer: Any, template: Any = None) -> Any:
        """A tokenizer bundle for visitor input (any field of the app): the trust policy decides
        what may be named (:class:`backend.safety.trust.TrustPolicy`); a template the visitor typed, or
        one that came with a tokenizer the visitor named, renders in the guarded worker."""
        from backend.families import PROFILES

        name = self.trust.tokenizer(tokenizer)
        choice = self.trust.template(template) if template is not None and str(template).strip() else None
        own = self.model.bundle
        if own is not None and name in (getattr(own, "name", None), self.model_tokenizer_name()):
            base = own
        elif name in PROFILES or name in self.trust.operator_tokenizers:
            base = self.tokenizers.get(name)
        else:  # local mode: a typed hub id or path, loaded as typed; its template is nobody's vetted one
            base = self.tokenizers.peek(name, None)
            if base is None:
                base = self.tokenizers.put(name, None, _load_typed_tokenizer(name))
        if choice is None:
            return base
        key = f"{choice.kind}:{choice.value}"
        hit = self.tokenizers.peek(base.name, key)
        if hit is not None and hit.tokenizer is base.tokenizer:
            return hit
        bundle = base.with_template(choice.value, allow_files=choice.kind == "file")
        return self.tokenizers.put(base.name, key, bundle)

    def trace_bundle(self, trace: Trace, override: str | None = None) -> tuple[Any | None, str]:
        """A tokenizer bundle to decode this trace's ids (with the trace's own template when it
        can be found: a trl template name, or the template text kept in the metadata), and a
        note when there is none. The trace's tokenizer and template names come from a file: they
        are visitor input. Offline profiles load; the model's own tokenizer when loaded; in local
        mode a local folder; hub ids are never fetched for it."""
        from backend.families import PROFILES

        name = override if override and override != "auto" else (trace.tokenizer.name or "")
        if not name:
            return None, "this trace names no tokenizer: showing token ids only (pick one under 'decode with')"
        bundle = None
        own = self.model.bundle
        if own is not None and name in (getattr(own, "name", None), self.model_tokenizer_name()):
            bundle = own
        elif name in PROFILES or (not self.trust.public and os.path.isdir(name)):
            try:
                bundle = self.visitor_bundle(name) if name in PROFILES else self.tokenizers.get(name).guarded()
            except Exception as e:  # noqa: BLE001
                return None, f"tokenizer {name!r} failed to load ({short_error(e)}): showing token ids only"
        else:
            bundle = self.tokenizers.loaded_named(name)
        if bundle is None:
            return None, f"tokenizer {name!r} is not available offline: showing token ids only (pick one under 'decode with')"
        return self._with_trace_template(bundle, trace), ""

    def _with_trace_template(self, bundle: Any, trace: Trace) -> Any:
        return self.trace_template(bundle, trace)[0]

    def trace_template(self, bundle: Any, trace: Trace) -> tuple[Any, str]:
        """``bundle`` with the template ``trace`` was made with when it can be found, and why
        not otherwise (:func:`backend.loading.tokenizers.with_trace_template`, the CLI's rule). A name or
        text from a file: never a path on a public server."""
        from backend.loading.tokenizers import with_trace_template

        def load(spec: str) -> Any:
            key = f"trace:{spec}"
            hit = self.tokenizers.peek(bundle.name, key)
            if hit is None or hit.tokenizer is not bundle.tokenizer:
                hit = self.tokenizers.put(bundle.name, key, bundle.with_template(spec, allow_files=not self.trust.public))
            return hit

        return with_trace_template(bundle, trace, allow_files=not self.trust.public, load=load)

    def warm_up(self) -> threading.Thread:
        """Load, in a background thread, the tokenizers the sample traces and the playground use;
        then, where the model backend runs the embedded default model, convert its folder from
        the GGUF (once per cache: ~5 s, on every cold start of a Space without persistent
        storage) while the first visitor reads the page, not after they press Send. Loading
        the model itself stays with the first run (on ZeroGPU app.py preloads it)."""
        names = {t.tokenizer.name for _, t in self.samples if t.tokenizer.name}
        names.add(self.default_tokenizer)
        embedded = self.embedded_model
        # transformers resolves its names lazily, and two threads resolving one at once can get
        # an ImportError (seen: 'cannot import name PreTrainedTokenizerFast'): resolve here,
        # once, before any request or this warm-up thread can
        from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401

        def work() -> None:
            from backend.families import PROFILES

            for n in sorted(names):
                if n in PROFILES:
                    try:
                        self.tokenizers.get(n)
                    except Exception:  # noqa: BLE001 - reported when the user opens the trace
                        pass
            if embedded:
                from backend.loading.models import default_model_path

                try:
                    default_model_path()  # a run that needs it meanwhile waits on the build's lock
                except Exception:  # noqa: BLE001 - the first run reports it, as it would without this
                    pass

        th = threading.Thread(target=work, name="ali-warm-up", daemon=True)
        th.start()
        return th

    @property
    def embedded_model(self) -> bool:
        """Whether the model backend runs the embedded default model (no --model)."""
        o = self.model.options
        return o is not None and runs_embedded_model(o.backend, o.model)

    @property
    def default_tool_choice(self) -> str:
        """The playground's tool_choice: a forced call on the first turn for the embedded default
        model, which never calls a tool on its own (backend.tool_choice.default_policy)."""
        return default_tool_choice(embedded_model=self.embedded_model)

    @property
    def default_backend_choice(self) -> str:
        return self.model.options.backend if self.model.available and self.default_script is None else "scripted"


def _load_typed_tokenizer(name: str) -> Any:
    """A tokenizer a local user typed (hub id or path): loaded as typed, its template guarded."""
    from backend.loading.tokenizers import load_tokenizer

    return load_tokenizer(name).guarded()


def load_samples(folder: Path = SAMPLE_DIR) -> tuple[list[tuple[str, Trace]], list[str]]:
    """The shipped sample traces, labelled ``file: id``."""
    from backend.trace import load_traces

    out: list[tuple[str, Trace]] = []
    problems: list[str] = []
    if not folder.is_dir():
        return out, [f"no sample folder at {folder}"]
    for path in sorted(folder.glob("*.jsonl")):
        try:
            res = load_traces(str(path))
        except Exception as e:  # noqa: BLE001
            problems.append(f"{path.name}: {short_error(e)}")
            continue
        for p in res.problems:
            problems.append(f"{path.name} line {p.line}: {p.reason}")
        for t in res.traces:
            label = t.metadata.get("title") if isinstance(t.metadata.get("title"), str) else t.id
            out.append((f"sample · {path.stem} · {label}", t))
    return out, problems


def free_label(label: str, taken: Any) -> str:
    """``label``, or ``label (2)``, ``label (3)``, … : the first not in ``taken``."""
    base, n = label, 2
    while label in taken:
        label = f"{base} ({n})"
        n += 1
    return label


_SESSION_LOCKS_MADE = threading.Lock()  # makes a session's file_lock once


@dataclass
class Session:
    """One browser session's state (in a ``gr.State``; never shared)."""

    traces: dict[str, Trace] = field(default_factory=dict)  # label → trace, in insertion order
    current: str | None = None
    file_traces: list[str] = field(default_factory=list)  # labels from the last uploaded file
    file_index: Any = None  # its backend.trace.TraceIndex (row i: file_traces[i]), which the Trace files tab lists
    file_name: str = ""
    file_problems: list[tuple[int, str]] = field(default_factory=list)
    # an upload of our own traces is not held: its rows (ui.trace_files.FileRows: the kept
    # file's index, each row's end state in words and search text) and the traces opened from it
    file_rows: Any = None
    # uploads and re-reads asked for so far (ui.trace_files.load_file): one that finishes after a
    # newer one was asked for is dropped, so the file shown is the one last asked for
    upload_seq: int = 0
    # held while the upload is swapped or a row of it is opened (file_lock()); made on first use
    # (gradio deep-copies a new session's value, which a lock cannot be)
    _file_lock: Any = field(default=None, repr=False, compare=False)
    # the Trace files table's filters as last listed (ui.trace_files.FileFilters; None: none yet,
    # all rows): what "Export filtered" exports when it is given no rows (the API's default table)
    file_filters: Any = None
    # the trace set the Trace files tab lists instead of the file (None: the file): the operator's
    # (--traces), or in local mode a folder typed in the tab; the app's SetRegistry, shared
    set_spec: str | None = None
    set_registry: Any = None
    set_view: Any = None  # what the set's table shows: filters, page, the version listed
    groups: Any = None  # the GRPO groups of what the Trace files tab shows (ui.grpo_groups.Held)
    # playground
    history: list[dict[str, Any]] = field(default_factory=list)  # conversation so far (no system)
    last_run: str | None = None
    runs: int = 0
    script_cursor: int = 0
    running: bool = False
    cancel: Any = None  # asyncio.Event of the run in progress
    # the session's download folders by kind (run, export, trace): the newest of each kind is
    # kept (gradio serves its own copy of a file once it is returned), all go when the session
    # ends (State delete_callback) or the app stops (backend.deploy.lifecycle)
    temp_dirs: dict[str, str] = field(default_factory=dict)
    # the routing key of the conversation (every message is a run; all of them go to one vLLM
    # server, which holds the conversation's prefix); a new one on Reset
    conversation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # the logprob lens's truncation cap C (ui/logprob_lens.py), as the visitor set it
    lens_cap: float = 2.0

    def file_lock(self) -> threading.RLock:
        """The session's lock over its upload (swapping it, opening a row of it): events of one
        session run concurrently (a re-read on a tokenizer change, a row clicked meanwhile)."""
        lock = self._file_lock
        if lock is None:
            with _SESSION_LOCKS_MADE:
                if self._file_lock is None:
                    self._file_lock = threading.RLock()
                lock = self._file_lock
        return lock

    def temp_dir(self, kind: str) -> str:
        from backend.deploy import lifecycle

        old = self.temp_dirs.pop(kind, None)
        if old:
            try:
                lifecycle.remove_temp_dir(old)
            except ValueError:
                pass  # not ours (the root was re-made): leave it
        d = lifecycle.temp_dir(f"ali-{re.sub(r'[^a-z]+', '', kind) or 'file'}-")
        self.temp_dirs[kind] = d
        return d

    def remove_temp_dirs(self) -> None:
        from backend.deploy import lifecycle

        for d in list(self.temp_dirs.values()):
            try:
                lifecycle.remove_temp_dir(d)
            except ValueError:
                pass
        self.temp_dirs.clear()

    def add(self, label: str, trace: Trace) -> str:
        label = free_label(label, self.traces)
        self.traces[label] = trace
        return label

    def get(self, label: str | None) -> Trace | None:
        if label is None:
            return None
        return self.traces.get(label)

    def __deepcopy__(self, memo: dict) -> Session:
        # gr.State deep-copies the value it gives each new session (also one built by a callable,
        # like build_app's initial_session): every field must survive, in containers of the
        # session's own. Traces are never mutated, so they are shared, not copied; a run's
        # cancel event belongs to the session that started it.
        import copy
        import dataclasses

        return dataclasses.replace(
            self, traces=dict(self.traces), file_traces=list(self.file_traces), file_problems=list(self.file_problems),
            history=copy.deepcopy(self.history, memo), running=False, cancel=None, temp_dirs={}, set_view=None, groups=None,
            conversation_id=uuid.uuid4().hex, _file_lock=None,
        )


def _set_registry() -> Any:
    import backend.importers  # noqa: F401 - registers other tools' readers with the trace-set catalogue
    from backend.trace.catalog import SetRegistry

    return SetRegistry()


def new_session(ctx: AppContext) -> Session:
    s = Session(set_spec=ctx.traces, set_registry=ctx.trace_sets)
    for label, t in ctx.samples:
        s.traces[label] = t
    if ctx.samples:
        s.current = ctx.samples[0][0]
    return s
