"""`poot backends`: every installed backend, its devices (or why it has none), a summary
of each device's capability table, and every plugin that failed to load."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("backends", help="list installed backends, their devices and what "
                       "each device declares it can run")
    p.add_argument("--table", action="store_true",
                   help="print each device's full support matrix (Markdown) instead of a "
                        "summary")


def describe(backend, full: bool = False, plugin: str = "", package: str = "",
             default: bool = False) -> list[str]:
    """The lines `poot backends` prints for one backend (`package`: the distribution and
    version its plugin came from; `default`: the one `poot run` picks without --backend)."""
    head = (f"{backend.name} (priority {backend.priority}, {backend.language or 'no language'}"
            f"{f', plugin {plugin}' if plugin else ''}{f', {package}' if package else ''})"
            f"{'  <- default' if default else ''}")
    from poot.plugin import probe

    devices, reason = probe(backend)
    if not devices:
        return [head, f"  no device: {reason}"]
    lines = [head]
    for d in devices:
        lines.append(f"  device {d}{software_note(backend, d)}")
        try:
            table = backend.capabilities(d)
        except Exception as exc:
            lines.append(f"    no capability table: {type(exc).__name__}: {exc}")
            continue
        text = table.to_markdown() if full else table.summary()
        lines += [f"    {line}" for line in text.splitlines()]
    return lines


def software_note(backend, device) -> str:
    """What a device line adds when the default pick passes the device over: a GPU API
    emulated on the CPU (lavapipe) runs only when named (poot.plugin.select_backend)."""
    if device.is_software and backend.language != "numpy":
        return f" (software: runs only when named, --backend {backend.name})"
    return ""


def default_pick() -> tuple[str | None, str]:
    """The backend `poot run` and `poot serve` pick without --backend, and a line saying
    which (or why none)."""
    from poot.errors import PootError
    from poot.plugin import select_backend

    try:
        b, dev = select_backend()
    except PootError as exc:
        return None, f"no default backend: {exc}"
    return b.name, (f"default: {b.name} on {dev} (what `poot run` and `poot serve` pick "
                    f"without --backend)")


def run(args) -> int:
    from poot.plugin import manager

    m = manager()
    table = m.backends()
    default, line = default_pick()
    for b in sorted(table.values(), key=lambda b: (-b.priority, b.name)):
        plugin = m.backend_plugins.get(b.name, "")
        print("\n".join(describe(b, args.table, plugin, m.distributions.get(plugin, ""),
                                 default=b.name == default)))
    print(line)
    if m.broken:
        print("plugins that failed to load:")
        for name, err in sorted(m.broken.items()):
            print(f"  {name}: {err}")
    return 0
