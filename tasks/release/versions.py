"""Registered versions and their aliases: a version is created `pending`, given the alias its gate decision gives,
then marked `finished`; a retry finishes a pending version, compares it again when the champion has moved since its
gate, and never registers a run twice (see tasks/register.py for the whole story)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.release.card import version_description
from grpo_pipeline.tasks.release.champion import current_champion
from grpo_pipeline.tasks.release.gate import TAG, GateDecision

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion


# A version is tagged `registration: pending` from its creation until its alias is set, then `finished`: a retry
# finishes a pending version, and never touches a finished one (whose alias may since have moved to a newer version).
REGISTRATION_TAG, PENDING, FINISHED = "registration", "pending", "finished"


class Registration(BaseModel):
    model_name: str
    version: str
    alias: str
    run_id: str
    model_uri: str
    gate: GateDecision
    # True when this run was registered before (a retry or a rerun): the existing version is returned as it is.
    existing: bool = False

    @property
    def gating_metric(self) -> str:
        return self.gate.metric

    @property
    def gating_value(self) -> float:
        return self.gate.challenger


def pending(version: ModelVersion) -> bool:
    return version.tags.get(REGISTRATION_TAG) == PENDING


def version_of_run(client: MlflowClient, name: str, run_id: str) -> ModelVersion | None:
    """The run's version of `name`, finished ones first. Another version of the run whose registration never
    finished (a create request that MLflow's HTTP client sent twice) is deleted, so the run keeps exactly one."""
    found = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    if not found:
        return None
    versions = [client.get_model_version(name, v.version) for v in found]  # the search leaves out aliases
    keep = min(versions, key=lambda v: (pending(v), not v.aliases, int(v.version)))
    for version in versions:
        if version.version != keep.version and pending(version):
            logger.warning("run %s has a second version of %s (%s): deleting it", run_id, name, version.version)
            client.delete_model_version(name, version.version)
    return keep


def champion_moved(client: MlflowClient, version: ModelVersion) -> bool:
    """Whether `champion` is on another version (or none) than the one `version`'s gate tags were compared with."""
    champion = current_champion(client, version.name)
    now = None if champion is None else str(champion.version)
    recorded = GateDecision.from_tags(version.tags).champion_version
    if now != recorded:
        logger.warning("version %s of %s was gated against champion %s, but the champion is now %s: comparing again",
                       version.version, version.name, recorded or "(none)", now or "(none)")  # fmt: skip
    return now != recorded


def regate(client: MlflowClient, version: ModelVersion, gate: GateDecision, card: str) -> ModelVersion:
    """`version`'s gate tags (on the version and on its run) and card replaced by `gate`, a comparison with the current
    champion. The champion's version is written last: a retry interrupted half-way finds the old one and compares
    again."""
    new, last = gate.tags(), f"{TAG}champion_version"
    client.update_model_version(version.name, version.version, description=version_description(card))
    for key, value in new.items():
        if key != last:
            client.set_model_version_tag(version.name, version.version, key, value)
            client.set_tag(version.run_id, key, value)
    for key in [k for k in version.tags if k.startswith(TAG) and k not in new and k != last]:
        delete_gate_tag(client, version, key)
    if last in new:
        client.set_tag(version.run_id, last, new[last])
        client.set_model_version_tag(version.name, version.version, last, new[last])
    elif last in version.tags:
        delete_gate_tag(client, version, last)
    return client.get_model_version(version.name, version.version)


def delete_gate_tag(client: MlflowClient, version: ModelVersion, key: str) -> None:
    """A gate tag the new decision does not have, off the run (if still there) and then off the version."""
    from mlflow.exceptions import MlflowException

    try:
        client.delete_tag(version.run_id, key)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    client.delete_model_version_tag(version.name, version.version, key)


def finished(client: MlflowClient, version: ModelVersion) -> ModelVersion:
    """A version whose registration was interrupted, given the alias its gate tags decide (if it has none yet) and
    marked finished. A finished version is left as it is, even one whose alias has moved on to a newer version."""
    if not pending(version):
        return version
    if not version.aliases:
        alias = "champion" if GateDecision.from_tags(version.tags).promote else "challenger"
        logger.warning("version %s of %s has no alias (its registration was interrupted): setting %s",
                       version.version, version.name, alias)  # fmt: skip
        client.set_registered_model_alias(version.name, alias, version.version)
    client.set_model_version_tag(version.name, version.version, REGISTRATION_TAG, FINISHED)
    return client.get_model_version(version.name, version.version)


def registration_of(client: MlflowClient, version: ModelVersion) -> Registration:
    """The Registration a version was created with (its gate tags), as it stands now."""
    current = client.get_model_version(version.name, version.version)
    return Registration(
        model_name=current.name,
        version=str(current.version),
        alias="champion" if "champion" in current.aliases else "challenger",
        run_id=current.run_id,
        model_uri=f"models:/{current.name}/{current.version}",
        gate=GateDecision.from_tags(current.tags),
        existing=True,
    )


def create_gated_version(
    client: MlflowClient,
    cfg: RegistryConfig,
    run_id: str,
    model_id: str,
    gate: GateDecision,
    tags: dict[str, str],
    card: str,
) -> Registration:
    """A new version of `cfg.model_name` that takes `champion` when the gate promotes it, else `challenger`."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(cfg.model_name)
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    mv = client.create_model_version(
        cfg.model_name,
        source=f"models:/{model_id}",
        run_id=run_id,
        tags={**tags, REGISTRATION_TAG: PENDING},
        description=version_description(card),
        model_id=model_id,
    )
    try:
        registration = Registration(
            model_name=cfg.model_name,
            version=str(mv.version),
            alias="champion" if gate.promote else "challenger",
            run_id=run_id,
            model_uri=f"models:/{cfg.model_name}/{mv.version}",
            gate=gate,
        )
        client.set_registered_model_alias(cfg.model_name, registration.alias, mv.version)
    except BaseException as e:
        # No half-registered versions: a version without its alias would confuse the next gating decision. When the
        # server is gone the version cannot be deleted either; the retry then finds it and sets its alias.
        try:
            client.delete_model_version(cfg.model_name, mv.version)
        except Exception as cleanup:
            logger.warning("version %s of %s kept without an alias (%s); a retry will set it", mv.version,
                           cfg.model_name, cleanup)  # fmt: skip
            raise e from None
        raise
    client.set_model_version_tag(cfg.model_name, mv.version, REGISTRATION_TAG, FINISHED)
    logger.info("registered %s version %s as %s: %s", cfg.model_name, mv.version, registration.alias, gate.explain())
    return registration
