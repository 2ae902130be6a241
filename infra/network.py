"""The VPC the TPU VMs live in: subnetwork, Cloud NAT and the firewall rules for DCN and SSH."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.config.environment import NetworkSettings
from training.validation import StrictModel

#: Ranges Identity-Aware Proxy TCP forwarding connects from; the only SSH source the firewall
#: admits. Source: https://cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule
IAP_SSH_RANGE = "35.235.240.0/20"


class NetworkArgs(StrictModel):
    """What :class:`Network` needs: the stack (names, tag), where, and ``multislice:network``."""

    stack: str
    project: str
    region: str
    settings: NetworkSettings = NetworkSettings()


def _path(value: str, project: str, collection: str, region: str | None = None) -> str:
    """``value`` as a resource path (a bare name gets ``projects/<p>/(global|regions/<r>)/...``)."""
    if "/" in value:
        return value
    scope = f"regions/{region}" if region else "global"
    return f"projects/{project}/{scope}/{collection}/{value}"


class Network(pulumi.ComponentResource):
    """Custom-mode VPC, one subnetwork in the zone's region, Cloud Router + NAT, firewall.

    * VPC: custom mode, MTU ``multislice:network.mtu`` (8896 by default), regional routing.
    * Subnetwork: ``subnetCidr`` in the zone's region, Private Google Access on (the VMs have
      no external IPs and still reach Cloud Storage and the Google APIs).
    * Cloud Router + Cloud NAT on that subnetwork: the VMs reach package registries
      (the startup script installs the trainer's pinned wheels).
    * Firewall, both INGRESS and both scoped to the VMs' network tag:

      - ``<prefix>-internal``: all TCP, UDP and ICMP from the same tag and the subnet range —
        DCN traffic between slices and the JAX coordinator (port 8482 since JAX 0.8.1);
      - ``<prefix>-iap-ssh``: TCP 22 from the IAP TCP-forwarding range 35.235.240.0/20 only.

      Nothing is opened to 0.0.0.0/0.

    Resource names and the tag come from :mod:`infra.naming` (``<prefix>-net``,
    ``<prefix>-subnet``, …, tag ``<prefix>-tpu``).

    With ``existingNetwork``/``existingSubnetwork`` only the firewall rules (and NAT if
    ``nat: true``) are created in the reused VPC; the subnet range is looked up.

    Attributes (Outputs): ``network`` and ``subnetwork`` (resource paths, what the TPU API
    takes), ``network_name``, ``subnetwork_name``, ``subnet_cidr``, ``tag`` (str),
    ``firewall_names``.
    """

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("multislice:gcp:Network", name, None, opts)
        settings, project, region = args.settings, args.project, args.region
        # Fixed names: a replacement must delete the old resource first.
        fixed = pulumi.ResourceOptions(parent=self, delete_before_replace=True)
        self.tag: str = naming.network_tag(args.stack)

        def resource_name(role: str) -> str:
            return naming.network_resource_name(args.stack, role)

        if settings.reuses_network:
            assert settings.existing_network and settings.existing_subnetwork
            self.network = pulumi.Output.from_input(_path(settings.existing_network, project, "networks"))
            subnet_path = _path(settings.existing_subnetwork, project, "subnetworks", region)
            self.subnetwork = pulumi.Output.from_input(subnet_path)
            parts = subnet_path.split("/")
            looked_up = gcp.compute.get_subnetwork_output(
                name=parts[-1], region=parts[3], project=parts[1], opts=pulumi.InvokeOutputOptions(parent=self)
            )
            self.subnet_cidr = looked_up.ip_cidr_range
            self.network_name = self.network.apply(lambda p: p.rsplit("/", 1)[-1])
            self.subnetwork_name = pulumi.Output.from_input(parts[-1])
        else:
            vpc = gcp.compute.Network(
                f"{name}-vpc",
                name=resource_name("net"),
                project=project,
                auto_create_subnetworks=False,
                mtu=settings.mtu,
                routing_mode="REGIONAL",
                description=f"Multislice stack {args.stack}: TPU VMs and their DCN traffic",
                opts=fixed,
            )
            subnet = gcp.compute.Subnetwork(
                f"{name}-subnet",
                name=resource_name("subnet"),
                project=project,
                region=region,
                network=vpc.id,
                ip_cidr_range=settings.subnet_cidr,
                private_ip_google_access=True,
                opts=fixed,
            )
            self.network, self.subnetwork = vpc.id, subnet.id
            self.network_name, self.subnetwork_name = vpc.name, subnet.name
            self.subnet_cidr = pulumi.Output.from_input(settings.subnet_cidr)

        if settings.creates_nat:
            router = gcp.compute.Router(
                f"{name}-router",
                name=resource_name("router"),
                project=project,
                region=region,
                network=self.network,
                opts=fixed,
            )
            gcp.compute.RouterNat(
                f"{name}-nat",
                name=resource_name("nat"),
                project=project,
                region=region,
                router=router.name,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
                subnetworks=[
                    gcp.compute.RouterNatSubnetworkArgs(name=self.subnetwork, source_ip_ranges_to_nats=["ALL_IP_RANGES"])
                ],
                # Many VMs install wheels at once on boot: let busy VMs take more ports.
                enable_endpoint_independent_mapping=False,
                enable_dynamic_port_allocation=True,
                min_ports_per_vm=64,
                max_ports_per_vm=4096,
                log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
                opts=fixed,
            )

        internal = gcp.compute.Firewall(
            f"{name}-internal",
            name=resource_name("internal"),
            project=project,
            network=self.network,
            direction="INGRESS",
            priority=1000,
            description="TPU VM to TPU VM: DCN collectives between slices and the JAX coordinator (8482)",
            allows=[
                gcp.compute.FirewallAllowArgs(protocol="tcp"),
                gcp.compute.FirewallAllowArgs(protocol="udp"),
                gcp.compute.FirewallAllowArgs(protocol="icmp"),
            ],
            source_tags=[self.tag],
            source_ranges=[self.subnet_cidr],
            target_tags=[self.tag],
            opts=fixed,
        )
        ssh = gcp.compute.Firewall(
            f"{name}-iap-ssh",
            name=resource_name("iap-ssh"),
            project=project,
            network=self.network,
            direction="INGRESS",
            priority=1000,
            description="SSH to the TPU VMs through Identity-Aware Proxy TCP forwarding only",
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            source_ranges=[IAP_SSH_RANGE],
            target_tags=[self.tag],
            opts=fixed,
        )
        self.firewall_names = pulumi.Output.all(internal.name, ssh.name)
        self.register_outputs(
            {
                "network": self.network,
                "subnetwork": self.subnetwork,
                "subnetCidr": self.subnet_cidr,
                "tag": self.tag,
                "firewallNames": self.firewall_names,
            }
        )
