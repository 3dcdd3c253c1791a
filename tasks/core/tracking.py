"""MLflow set-up shared by the stages: one tracking URI, one experiment, runs named after the recipe."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_pipeline.tasks.core.common import logger

if TYPE_CHECKING:  # mlflow loads when a stage talks to it, not when the flow is imported
    import mlflow
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.client.schemas.responses import GlobalConcurrencyLimitResponse


# A registered model version's URI: models:/<name>@<alias> or models:/<name>/<version> (MLflow's models: scheme).
REGISTRY_PREFIX = "models:/"
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


# Held while MLFLOW_TRACKING_URI is read, and while use_store sets MLflow's URI and puts the variable back: threads
# of one process (the flow's concurrent stages, its Ray fan-out) point MLflow at a store at the same time.
_STORE_LOCK = threading.RLock()


def tracking_uri(run_dir: str | Path) -> str:
    """MLFLOW_TRACKING_URI when set (e.g. a tracking server), else a SQLite store under the run directory."""
    with _STORE_LOCK:  # never the value another thread's use_store has not yet put back
        chosen = os.environ.get("MLFLOW_TRACKING_URI")
    return chosen or f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}"


def use_store(run_dir: str | Path) -> str:
    """Point this process's MLflow client at the run's store (tracking_uri) and return its URI.

    mlflow.set_tracking_uri also writes MLFLOW_TRACKING_URI into the environment, which tracking_uri reads first as
    the user's choice: without the restore, the first run directory a process used would be every later one's store
    (a second run directory's stages logging into the first's SQLite file). The user's own variable, if any, stays.
    Reading, setting and restoring happen under one lock: two threads that interleaved them could each restore the
    other's value, leaving a store of theirs in the environment for every later run of the process.
    """
    import mlflow

    with _STORE_LOCK:
        before = os.environ.get("MLFLOW_TRACKING_URI")
        uri = tracking_uri(run_dir)
        mlflow.set_tracking_uri(uri)
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
    return uri


_HOW_TO_FIX = ": start the tracking server, or point MLFLOW_TRACKING_URI at one that is up"


class TrackingUnavailable(ConnectionError):
    """The MLflow tracking server does not answer (stopped, restarting, out of reach): worth retrying later."""


def require_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise TrackingUnavailable at once when the tracking server at `uri` does not answer its health check.

    MLflow's own client retries a refused connection for about four minutes (MLFLOW_HTTP_REQUEST_MAX_RETRIES=7,
    backoff factor 2, in mlflow/environment_variables.py) with no word in the run's log; a stage that checks first
    fails within seconds with the server's address in its error, and the stage's retries (which log their delay)
    take over. Only an absent answer counts: any HTTP response but 502-504 (a proxy in front of a server that is
    down) means the server is there. Local stores (sqlite, file) and non-HTTP schemes are not checked, nor is a TLS
    failure an outage (MLflow's own call reports it)."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    url = f"{uri.rstrip('/')}/health"
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.exceptions.SSLError:
        return
    except (requests.ConnectionError, requests.Timeout) as e:
        raise TrackingUnavailable(f"MLflow at {uri} is unreachable ({type(e).__name__} on {url}){_HOW_TO_FIX}") from e
    if response.status_code in (502, 503, 504):
        raise TrackingUnavailable(f"MLflow at {uri} is unavailable (HTTP {response.status_code} on {url}){_HOW_TO_FIX}")


def unreachable(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, says the tracking server could not be reached or could not
    serve the request: TrackingUnavailable; the connection error, timeout or run of 5xx/429 answers (urllib3's
    RetryError) that MLflow wraps in an MlflowException once its own client has given up retrying; or a server error
    (HTTP 5xx) that the server itself reported (a RestException, e.g. its database went away). Such a failure says
    nothing about the request, and is retried like an outage; a 4xx answer (a refused permission, a bad request) is
    not."""
    import requests
    from mlflow.exceptions import RestException

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, requests.exceptions.SSLError):
            return False
        if isinstance(exc, TrackingUnavailable | requests.ConnectionError | requests.Timeout):
            return True
        if isinstance(exc, requests.exceptions.RetryError):
            return True
        if isinstance(exc, RestException) and exc.get_http_status_code() >= 500:
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def configure_mlflow(run_dir: str | Path, experiment: str) -> str:
    """Point MLflow at the store and the experiment (created if new); returns the experiment id.

    The process's tracking URI is set, not the environment: TRL's MLflow callback keeps a URI that is already set,
    and two runs with different run directories in one process keep their own stores.
    """
    import mlflow

    uri = use_store(run_dir)
    # Two runs sharing a SQLite store (one run directory) would both create its tables on first use (measured:
    # "table _alembic_tmp_experiments already exists") and both create the experiment; one at a time, the second
    # finds them made. A server serialises this itself.
    db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    with file_lock(Path(f"{db}.lock"), f"the MLflow store {db}") if db else contextlib.nullcontext():
        exp = mlflow.get_experiment_by_name(experiment)
        if exp is None:
            # A local store keeps artifacts beside the database; a server decides for itself.
            location = (Path(run_dir).resolve() / "mlartifacts").as_uri() if db else None
            exp_id = mlflow.create_experiment(experiment, artifact_location=location)
        else:
            exp_id = exp.experiment_id
        if exp is None or exp.tags.get(EXPERIMENT_KIND_TAG) is None:
            # MLflow 3 opens an experiment without this tag in its GenAI view (traces, evaluation runs); a training
            # pipeline's runs belong in the model-training view.
            mlflow.MlflowClient().set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


@contextlib.contextmanager
def file_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if absent) for the block, saying so when another process holds it.

    An OS lock (flock), not a lock file that must be removed: it goes away with the process that held it, so a run
    that crashed or was killed never leaves others waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another run to finish with %s (lock %s)", what, path)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def registry_lock(run_dir: str | Path, model_name: str) -> Iterator[None]:
    """Gating of one registered model, one run at a time, from reading the champion to moving the alias: two runs
    gating at once would both see the same champion (or none) and could both take `champion` (measured: two
    concurrent first runs both registered as "first version").

    Every run that shares the Prefect API (PREFECT_API_URL: a Prefect server or Prefect Cloud, as every deployment
    and worker does) holds the one slot of a Prefect global concurrency limit named after the model (`gate_slot`),
    wherever it runs and whichever tracking server address it uses. Runs that share a run directory also hold a file
    lock there (as before): it needs no server, and it is what serialises runs on a temporary local Prefect server
    (no PREFECT_API_URL), where a global concurrency limit is not used (see `gate_slot`). The slot is taken before
    the file lock, always, so the two never wait on each other in opposite orders."""
    key = hashlib.sha256(f"{tracking_uri(run_dir)}\0{model_name}".encode()).hexdigest()[:16]
    with contextlib.ExitStack() as held:
        if prefect_api_url():
            held.enter_context(gate_slot(model_name))
        held.enter_context(
            file_lock(Path(run_dir).resolve() / ".locks" / f"register-{key}.lock", f"registering {model_name}")
        )
        yield


def prefect_api_url() -> str | None:
    """The Prefect API that flows run against, when one is configured (None: a temporary local server per run)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


GATE_LIMIT_PREFIX = "grpo-pipeline-gate-"


def gate_limit_name(model_name: str) -> str:
    """The Prefect global concurrency limit that serialises gating `model_name`: the model's name, with the characters
    Prefect refuses in names (/ % & > <) replaced and a short hash of the real name appended when any was."""
    from prefect.types.names import BANNED_CHARACTERS

    safe = "".join("_" if c in BANNED_CHARACTERS else c for c in model_name)
    if safe != model_name:
        safe += "-" + hashlib.sha256(model_name.encode()).hexdigest()[:8]
    return f"{GATE_LIMIT_PREFIX}{safe}"


@contextlib.contextmanager
def gate_slot(model_name: str) -> Iterator[None]:
    """Hold the one slot of the model's global concurrency limit on the Prefect API, waiting for it as long as it
    takes. The limit is created on first use: Prefect 3.9 skips a limit that does not exist (with a warning) unless
    `strict`, and its server no longer creates one on acquisition (`create_if_missing` is deprecated).

    The slot is a lease that the holder renews while it runs, so a run that dies leaves it taken only until the lease
    runs out (300 s) on a Prefect server. Not used on a temporary local server (no PREFECT_API_URL): its leases live
    in that server's memory and die with it, while the slot stays taken in the database that other runs on the same
    PREFECT_HOME share, so a run killed mid-registration would block the model's gate there for good."""
    from prefect.concurrency.sync import concurrency

    name = gate_limit_name(model_name)
    if _single_slot_limit(name).active_slots:
        logger.info("waiting for another run gating %s to finish (Prefect global concurrency limit %s; if no run is "
                    "gating it, free the slot with `prefect gcl update %s --active-slots 0`)", model_name, name,
                    name)  # fmt: skip
    with concurrency(name, occupy=1, strict=True, holder=_holder()):
        yield


def _single_slot_limit(name: str) -> GlobalConcurrencyLimitResponse:
    """The global concurrency limit `name`, created with one slot if it does not exist; refused when it allows more
    than one holder or is disabled, since gating would then not be serialised."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            logger.info("created the Prefect global concurrency limit %s (1 slot) that serialises gating", name)
        except ObjectAlreadyExists:
            pass  # another run created it first
        limit = client.read_global_concurrency_limit_by_name(name)
    if limit.limit != 1 or not limit.active:
        state = f"{limit.limit} slot(s)" + ("" if limit.active else ", disabled")
        raise ValueError(
            f"Prefect global concurrency limit {name} has {state}, so two runs could gate the model at once: "
            f"`prefect gcl update {name} --limit 1 --enable`"
        )
    return limit


def _holder() -> ConcurrencyLeaseHolder | None:
    """The task run (or flow run) that holds the slot, shown with the limit in the Prefect UI."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.context import FlowRunContext, TaskRunContext

    if (task := TaskRunContext.get()) is not None:
        return ConcurrencyLeaseHolder(type="task_run", id=task.task_run.id)
    if (run := FlowRunContext.get()) is not None and run.flow_run is not None:
        return ConcurrencyLeaseHolder(type="flow_run", id=run.flow_run.id)
    return None


@contextlib.contextmanager
def mlflow_run(
    run_dir: str | Path, experiment: str, run_name: str, tags: dict[str, str], resume: str | None = None
) -> Iterator[mlflow.ActiveRun]:
    """Start a fresh MLflow run (ending any run left active in this thread) and end it on exit.

    `resume` names a run to continue instead (a stage resuming from its checkpoint logs on into the run it started);
    a run the store no longer has is replaced by a fresh one."""
    import mlflow
    from mlflow.exceptions import MlflowException

    configure_mlflow(run_dir, experiment)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    if resume is not None:
        try:
            active = mlflow.start_run(run_id=resume)
        except MlflowException as e:
            logger.warning("MLflow run %s cannot be continued (%s); starting a new one", resume, e)
        else:
            with active as run:
                mlflow.set_tags(tags)
                yield run
            return
    with mlflow.start_run(run_name=run_name, tags=tags) as run:
        yield run
