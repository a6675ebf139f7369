"""Helpers for setting up distributed workers (upstream: vllm/distributed/utils.py
and the network helpers of vllm/utils)."""

from __future__ import annotations

import socket

from vllm import envs


def get_ip() -> str:
    """This host's address for other nodes: VLLM_HOST_IP, else the address of
    the interface a UDP socket to a public address would use, else loopback."""
    host_ip = envs.VLLM_HOST_IP
    if host_ip:
        return host_ip
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("8.8.8.8", 80))  # no packet is sent: only picks a route
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def get_open_port() -> int:
    """A TCP port that is free right now (bound then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def get_distributed_init_method(ip: str, port: int) -> str:
    """torch.distributed's TCP rendezvous URL."""
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"


def divide(numerator: int, denominator: int) -> int:
    """numerator / denominator, which must divide exactly."""
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}.")
    return numerator // denominator


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the layers of pipeline stage `pp_rank`: an even split,
    with the remainder on the earlier stages (the last stage also holds the
    final norm and the LM head)."""
    base, extra = divmod(num_hidden_layers, pp_size)
    sizes = [base + (1 if i < extra else 0) for i in range(pp_size)]
    if min(sizes) == 0:
        raise ValueError(
            f"{num_hidden_layers} layers cannot be split into {pp_size} pipeline stages."
        )
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]
