"""Peak resident memory of this process, as the kernel counts it (Linux ``/proc``): shared by the memory benchmarks."""


def rss_kb(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` (peak) of this process in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS, so the next peak is the next step's."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
