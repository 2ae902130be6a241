"""The VPC the TPU VMs live in: subnetwork, Cloud NAT and the firewall rules for DCN and SSH.

Firewall semantics this module relies on (Compute Engine API, ``firewalls`` resource,
https://cloud.google.com/compute/docs/reference/rest/v1/firewalls): "If both [sourceRanges and
sourceTags] are set, an inbound connection is allowed if the range or the tag of the source
matches", so a rule that names the subnet range *and* the tag admits every VM of the subnet.
The internal rule therefore admits by tag alone: only the stack's TPU VMs reach each other.
Rules, routers and NAT gateways belong to the network's project, which for a Shared VPC is the
host project (https://cloud.google.com/vpc/docs/shared-vpc).
"""

from __future__ import annotations

import functools

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.config.environment import NetworkSettings
from training.validation import StrictModel
from training.warning_text import WarningText, act, emit

#: The key a subnetwork that belongs to another network is reported under.
SUBNETWORK_KEY = "multislice:network.existingSubnetwork"

#: Ranges Identity-Aware Proxy TCP forwarding connects from; the only SSH source the firewall
#: admits. Source: https://cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule
IAP_SSH_RANGE = "35.235.240.0/20"
#: The one port that range is admitted on (SSH), and only with ``multislice:network.iapSsh``.
SSH_PORT = "22"


class NetworkArgs(StrictModel):
    """What :class:`Network` needs: the stack (names, tag), where, and ``multislice:network``."""

    stack: str
    project: str
    region: str
    settings: NetworkSettings = NetworkSettings()


def check_subnetwork_network(network_path: str, subnet_path: str, subnet_network: str | None) -> str:
    """``network_path`` if the looked-up subnetwork belongs to that network.

    Args:
      network_path: ``projects/<p>/global/networks/<n>`` (``existingNetwork``).
      subnet_path: the subnetwork's path (``existingSubnetwork``), for the message.
      subnet_network: the ``network`` URL the Compute API returns for the subnetwork
        (``https://www.googleapis.com/compute/v1/projects/<p>/global/networks/<n>``); None or
        empty when unknown (the check then passes: nothing to compare).

    Raises:
      pulumi.RunError: the subnetwork is in another network; the TPU API would refuse the
        pair only after everything else exists. The message names the key.
    """
    if subnet_network and not subnet_network.endswith("/" + network_path):
        other = subnet_network.split("/projects/", 1)[-1]
        raise pulumi.RunError(
            f"{SUBNETWORK_KEY}: {subnet_path} belongs to network projects/{other}, not to existingNetwork "
            f"{network_path}; name a subnetwork of that network"
        )
    return network_path


#: The Cloud TPU service agent of a project, by project number, as
#: https://cloud.google.com/tpu/docs/cross-project-sa grants roles to it.
TPU_SERVICE_AGENT = "service-{number}@gcp-sa-tpu.iam.gserviceaccount.com"


def shared_vpc_notice(project: str, settings: NetworkSettings, region: str) -> WarningText | None:
    """The preview warning of a stack whose subnetwork is in another project (a Shared VPC
    host), else None.

    Shared VPC admits a service project's resources into a host subnetwork through
    ``roles/compute.networkUser`` on the host project or that subnetwork
    (https://cloud.google.com/vpc/docs/shared-vpc), and the services that create VMs for you
    need it for their service agents (GKE, Dataproc, Dataflow document it). Cloud TPU's own pages
    do not say whether its service agent needs it ("the following instructions don't take Shared
    VPC ... into consideration. Additional configurations or permissions may be required":
    https://cloud.google.com/tpu/docs/cross-project-sa), so this program neither grants it (that
    takes IAM admin rights on the host, which a service project's deployer rarely holds) nor
    refuses the stack: it says what to grant when the queued resource fails for want of it.
    docs/deploying.md "Shared VPC".
    """
    host = settings.host_project(project)
    subnet = settings.subnetwork_path(project, region)
    if host == project or subnet is None:
        return None
    name, subnet_region = subnet.rsplit("/", 1)[-1], subnet.split("/")[3]
    agent = TPU_SERVICE_AGENT.format(number=f"$(gcloud projects describe {project} --format='value(projectNumber)')")
    return act(
        f"Shared VPC: the TPU VMs join {subnet} of host project {host}",
        f"have a host project admin grant the Cloud TPU service agent of {project} roles/compute.networkUser "
        f"on it: gcloud compute networks subnets add-iam-policy-binding {name} --project {host} "
        f'--region {subnet_region} --member "serviceAccount:{agent}" --role roles/compute.networkUser '
        "(docs/deploying.md, Shared VPC)",
        when="the queued resource fails with a permission error on that subnetwork",
    )


class Network(pulumi.ComponentResource):
    """Custom-mode VPC, one subnetwork in the zone's region, Cloud Router + NAT, firewall.

    * VPC: custom mode, MTU ``multislice:network.mtu`` (8896 by default), regional routing.
    * Subnetwork: ``subnetCidr`` in the zone's region, Private Google Access on (the VMs have
      no external IPs and still reach Cloud Storage and the Google APIs).
    * Cloud Router + Cloud NAT on that subnetwork: the VMs reach package registries
      (the startup script installs the trainer's pinned wheels).
    * Firewall, both INGRESS and both scoped to the VMs' network tag:

      - ``<prefix>-internal``: all TCP, UDP and ICMP from the same tag only (not the subnet
        range: a reused subnetwork holds other VMs) — DCN traffic between slices and the JAX
        coordinator (port 8482 since JAX 0.8.1);
      - ``<prefix>-iap-ssh``, only with ``multislice:network.iapSsh: true``: TCP 22 from the IAP
        TCP-forwarding range 35.235.240.0/20 only (``multislice exec`` connects through it).

      Nothing is opened to 0.0.0.0/0; without ``iapSsh`` no SSH ingress exists at all.

    Resource names and the tag come from :mod:`infra.naming` (``<prefix>-net``,
    ``<prefix>-subnet``, …, tag ``<prefix>-tpu``).

    With ``existingNetwork``/``existingSubnetwork`` only the firewall rules (and router + NAT
    if ``nat: true``) are created, in the network's project (the host project of a Shared
    VPC). The subnetwork is looked up (``getSubnetwork``) at preview: a missing one fails
    there, and one of another network fails with :func:`check_subnetwork_network`.

    Attributes (Outputs): ``network`` and ``subnetwork`` (resource paths, what the TPU API
    takes), ``network_name``, ``subnetwork_name``, ``subnet_cidr``, ``tag`` (str),
    ``firewall_names``.
    """

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("multislice:gcp:Network", name, None, opts)
        settings, region = args.settings, args.region
        # The network's own project: where its firewall rules, router and NAT must live.
        project = settings.host_project(args.project)
        # Fixed names: a replacement must delete the old resource first.
        fixed = pulumi.ResourceOptions(parent=self, delete_before_replace=True)
        self.tag: str = naming.network_tag(args.stack)

        def resource_name(role: str) -> str:
            return naming.network_resource_name(args.stack, role)

        notice = shared_vpc_notice(args.project, settings, region)
        if notice:
            emit(notice, functools.partial(pulumi.log.warn, resource=self))
        if settings.reuses_network:
            network_path = settings.network_path(args.project)
            subnet_path = settings.subnetwork_path(args.project, region)
            assert network_path and subnet_path
            parts = subnet_path.split("/")
            looked_up = gcp.compute.get_subnetwork_output(
                name=parts[-1], region=parts[3], project=parts[1], opts=pulumi.InvokeOutputOptions(parent=self)
            )
            # Everything in the network waits for the check that the subnetwork is in it.
            self.network = looked_up.network.apply(lambda url: check_subnetwork_network(network_path, subnet_path, url))
            self.subnetwork = pulumi.Output.from_input(subnet_path)
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
                    gcp.compute.RouterNatSubnetworkArgs(
                        name=self.subnetwork, source_ip_ranges_to_nats=["ALL_IP_RANGES"]
                    )
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
            target_tags=[self.tag],
            opts=fixed,
        )
        names = [internal.name]
        if settings.iap_ssh:
            ssh = gcp.compute.Firewall(
                f"{name}-iap-ssh",
                name=resource_name("iap-ssh"),
                project=project,
                network=self.network,
                direction="INGRESS",
                priority=1000,
                description="SSH to the TPU VMs through Identity-Aware Proxy TCP forwarding only",
                allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=[SSH_PORT])],
                source_ranges=[IAP_SSH_RANGE],
                target_tags=[self.tag],
                opts=fixed,
            )
            names.append(ssh.name)
        self.firewall_names = pulumi.Output.all(*names)
        self.register_outputs(
            {
                "network": self.network,
                "subnetwork": self.subnetwork,
                "subnetCidr": self.subnet_cidr,
                "tag": self.tag,
                "firewallNames": self.firewall_names,
            }
        )
