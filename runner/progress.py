"""The rich progress bar of long work (train steps, probe batches), on a TTY only: a log file or a
sweep job gets no bar, and nothing is imported from rich unless a bar is shown."""

from __future__ import annotations


class Progress:
    def __init__(self, label: str, total: int, enabled: bool, info: bool = False):
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            columns = [TextColumn(f"[bold]{label}[/bold]"), BarColumn(), MofNCompleteColumn()]
            if info:
                columns.append(TextColumn("{task.fields[info]}"))
            self._bar = Bar(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._task = self._bar.add_task(label, total=total, info="")
            self._bar.start()

    def advance(self, info: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
