"""The rollout API client lives in :mod:`rollout_client.http` (one client for every trainer); the names stay."""

from rollout_client.errors import RolloutApiError
from rollout_client.http import AsyncRolloutClient, RolloutClient

__all__ = ["AsyncRolloutClient", "RolloutApiError", "RolloutClient"]
