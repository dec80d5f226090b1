"""Python SDK of trill serve. Mirrors Tinker's SDK, so a Tinker loop runs with
`import trill_client as tinker`; docs/service.md is the protocol underneath."""

from . import types
from .client import APIFuture, SamplingClient, ServiceClient, Tokenizer, TrainingClient, TrillError
from .types import *  # noqa: F401,F403  (tinker.Datum, tinker.ModelInput, ... as Tinker has them)

__all__ = ["types", "APIFuture", "SamplingClient", "ServiceClient", "Tokenizer", "TrainingClient",
           "TrillError"] + types.__all__
