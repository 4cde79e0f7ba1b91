"""The tracker's exception tree: every error it raises on purpose, and what each branch means for the caller.

Like httpx's ``_exceptions.py``, the whole tree is written out here; the classes themselves live beside the code
that raises them (the tree names their modules, relative to ``tracker``), and each keeps the standard base class
its callers and tests rely on (``ValueError``, ``RuntimeError``, ``TimeoutError``). ``tests/core/test_error_tree.py``
checks the picture against the classes, both ways::

    TrackerError
    ├── Retryable                              transient: the loop that meets it tries again, with capped backoff
    │   ├── shell.watch.stream.Gone            410: resume point expired; the stream lists again
    │   ├── shell.watch.stream.BrokenStream    a line that is not a watch event; the stream reconnects
    │   ├── shell.leader.LeadershipLost        the lease is no longer certainly held; the term ends, campaign again
    │   ├── shell.kafka.KafkaCallTimeout       (TimeoutError) a Kafka call outlived ``kafka.call_timeout_s``
    │   └── shell.deadline.DeadlineExceeded    (TimeoutError) an SDK call outlived its deadline
    ├── Fatal                                  the command stops: one "stopped_by_an_error" line, its ``exit_code``
    │   ├── ConfigError                        (ValueError) a setting, option or file given that cannot work
    │   │   ├── settings.SettingsError         the settings tree does not validate
    │   │   ├── shell.kube.KubeconfigError     no usable kubeconfig: where it was looked for, how to give one
    │   │   ├── runtime.replay.ReplayError     no capture file given, or invalid settings, for a replay (exit 2)
    │   │   ├── shell.capture.NotACapture      a capture path given that is a device or a socket (exit 2)
    │   │   └── shell.compiled_core.StaleCompiledCore  a compiled core older than its sources (exit 2)
    │   ├── GaveUp                             (RuntimeError) retries of a transient fault ran out
    │   │   ├── runtime.reduce.ReduceFatal
    │   │   ├── runtime.sinks.SinkFatal
    │   │   └── shell.watch.stream.WatchFatal  (also: a stream's loop failed in a way no reconnect mends)
    │   ├── StoredStateError                   (ValueError) stored state this tracker cannot continue from (a
    │   │   │                                  snapshot of a version it does not read or of another shape:
    │   │   │                                  core.snapshot, core.snapshot_shape)
    │   │   └── shell.watch.checkpoint.CheckpointError
    │   ├── shell.reducer_state.StateError     (RuntimeError) the index's reducer state is unusable
    │   ├── shell.index_schema.IndexSchemaError (RuntimeError) not an experiment index this tracker can use
    │   │   └── shell.index_schema.IndexOpenError  cannot be opened at all
    │   ├── shell.index_lock.WriterBusy        (RuntimeError) another writer holds the index (exit 75)
    │   ├── shell.kafka.TopicLayoutError       (RuntimeError) topics missing or laid out otherwise
    │   ├── shell.kafka.KafkaSecurityError     (KafkaError) credentials or TLS refused
    │   ├── shell.kusto_apply.ApplyError       (RuntimeError) the ADX cluster refused a schema command
    │   ├── read.store.IndexQueryError         (ValueError) a query the index cannot answer as asked
    │   ├── cli.args.UsageError                a command line that cannot work (exit 2)
    │   └── cli.args.NotFound                  what was asked for is not there (exit 1)
    ├── InvalidInput                           (ValueError) one input record is refused: it costs that record only
    │   ├── core.extract.Malformed             (a dead letter, an anomaly, a skipped record), never the process;
    │   ├── core.timefmt.BadTimestamp          the sinks skip (and commit past) this branch and nothing else
    │   ├── shell.capture._ReadError           a capture's bytes do not read
    │   ├── shell.transitions.BadTransition    a transitions record that is not what its kind and key say
    │   ├── shell.index_rows.RefusedUpdate     an update the index cannot store as it is
    │   ├── read.filters.FilterError           a filter value that cannot work (the CLI: a usage error; the web: 400)
    │   │   └── read.filters.TimeRangeError    a time outside the years 1 to 9999 in UTC
    │   ├── read.jsonpath.JsonPathError    a -o jsonpath= template or custom-columns= spec that does not parse
    │   └── ui.server.QueryError               a query string the web view refuses: a 400 page, the server goes on
    ├── shell.index_lock.WaitStopped           a wait for an index's writer role ended by a stop request (a
    │                                          SIGTERM to a standing-by ``sink index``): the process stops as asked
    └── shell.kube.ApiError                    an API server's answer: the stream and the elector retry it by
                                               status; it stops ``tracker watch`` only when it reaches the top

Catch by branch: ``InvalidInput`` at a record's boundary (the sinks skip it and go on; a builtin ``ValueError`` or
``TypeError`` is a bug and is not skipped), ``Fatal`` at the top, with the exit code the class carries. Retry loops
retry the faults they know by type (``Retryable`` leaves and the libraries' errors: ``shell.kafka.retrying``,
``shell.changes``), so no flag on the classes says so.

What a process treats as fatal at its top (``runtime.service.FATAL``) is ``Fatal`` plus the faults of the world
outside that libraries raise (``KafkaError``, ``OSError`` and ``TimeoutError``, ``sqlite3.Error``) once a retry
loop has given up on them or where none applies; anything else reaching the top is a bug and keeps its traceback.

This module is the bottom layer: it imports nothing, so the pure core can raise from the tree too.
"""

from __future__ import annotations

from typing import ClassVar


class TrackerError(Exception):
    """Base of every error the tracker raises on purpose."""


class Retryable(TrackerError):
    """A transient fault: trying again (after a backoff) may succeed."""


class Fatal(TrackerError):
    """No retry can mend this: the process (or command) stops with one line and a non-zero exit code.

    ``exit_code`` is the code a command exits with when this error reaches its top (a branch may change it)."""

    exit_code: ClassVar[int] = 1


class ConfigError(Fatal, ValueError):
    """A setting, command-line option or given file that cannot work; the message names it."""


class GaveUp(Fatal, RuntimeError):
    """A transient fault outlasted its retries (``max_retries`` in a row)."""


class StoredStateError(Fatal, ValueError):
    """State stored by a tracker (a checkpoint, a snapshot) that this tracker cannot continue from."""


class InvalidInput(TrackerError, ValueError):
    """One input record (an object, a timestamp, a capture line) is refused; it costs that record only."""


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors ``exc`` consists of: itself, or the leaves of its nested exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]
