"""What leaves a desktop: secrets it uses without holding them, and the egress proxy
that judges its connections by host name and puts those secrets in its requests.

- `SecretStore` (`secrets.py`): `POST /api/secrets`, encrypted at rest.
- `EgressProxy` (`proxy.py`): on this host's loopback, fed by each desktop's egress
  supervisor (`cubicle.server.runtime.egress`); one `Tenant` per desktop that needs it.
- `hello.py`: the server name of a TLS ClientHello.

A desktop that uses a secret sees `cubicle-secret:<name>` in its variable; its egress
proxy's CA in its trust bundle; nothing else of the secret (docs/networking.md).
"""

from __future__ import annotations

from cubicle.server.outbound.proxy import EgressProxy, Tenant
from cubicle.server.outbound.secrets import Secret, SecretStore
from cubicle.server.runtime.egress import Policy, parse_networks
from cubicle.server.settings import Settings

__all__ = ["EgressProxy", "Outbound", "Secret", "SecretStore", "Tenant"]


class Outbound:
    """The service's secrets and its egress proxy (which starts with its first desktop)."""

    def __init__(self, settings: Settings) -> None:
        self.secrets = SecretStore(settings.data_dir / "secrets", settings.secrets_key)
        operator = Policy(
            allow=parse_networks(settings.egress_allow), deny=parse_networks(settings.egress_deny)
        )
        self.proxy = EgressProxy(
            self.secrets, operator, settings.data_dir / "egress-proxy", settings.egress_ca_file
        )

    def close(self) -> None:
        self.proxy.close()
