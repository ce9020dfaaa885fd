"""`hir-opt` and `filecheck` for lit's RUN lines, forked from a process that has imported them.

A `hir-opt` process spends nearly all of its 0.4 s of CPU importing xDSL and hostir, and
`filecheck` most of its 0.1 s importing; the lit suite starts them hundreds of times.
lit.cfg.py starts `serve` once per lit run: it imports the tools as `tools/hir-opt.py` and
`python -m filecheck` do, then forks a child for each command of a RUN line. The command
is this file run as a client, which starts in a few milliseconds (no site, no imports
beyond the standard library's core) and hands the child its arguments, working directory,
environment and its stdin, stdout and stderr (passed over the socket as file
descriptors), then exits with the child's status. The child rebuilds sys.stdin, stdout
and stderr as Python builds them at start-up and runs the tool's `main` as its script
does, so the command behaves as a fresh process of the tool would.

Where no server answers (it failed to start, or the client runs outside lit), the client
runs the tool itself, in a fresh process.

The server ends with lit, whenever lit ends, even before the server is done importing:
it reads a pipe whose only writer is lit, and ends at its end of file.

    python preload.py serve SOCKET_FD LIT_FD          # start_server: a listening socket, lit's pipe
    python -I -S preload.py SOCKET_PATH TOOL ARGS...  # a RUN line's command (client_command)
"""

import _socket  # not `socket`, whose import would be half of the client's start
import marshal
import os
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIR_OPT = os.path.join(REPOSITORY, "tools", "hir-opt.py")
WARM_UP = os.path.join(REPOSITORY, "examples", "ag_linear.mlir")
"""What the server lowers once, before it forks any child."""

COMMANDS = {"hir-opt": [HIR_OPT], "filecheck": ["-m", "filecheck"]}
"""What the interpreter runs for each tool in a fresh process."""

_HEADER = 8
"""Bytes of the request's length, sent first with the three file descriptors."""


def start_server(directory: str) -> "subprocess.Popen[bytes]":
    """Starts the server on `directory`/socket. It serves until this process exits or it is
    terminated, then removes the socket and the directory.

    This process keeps the write end of a pipe open, never writing to it, until it exits;
    the server ends at the pipe's end of file. The descriptor is not inheritable, so the
    commands lit runs do not hold it open. (The server's parent is no sign: lit may exit
    before the server has imported anything, and the server then has init's pid to
    compare with, which it would take for lit's.)"""
    import socket
    import subprocess

    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(os.path.join(directory, "socket"))
    listening.listen(64)
    lit_alive, _held_by_lit = os.pipe()  # the write end: never closed, never written to
    server = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "serve", str(listening.fileno()), str(lit_alive)],
        pass_fds=[listening.fileno(), lit_alive],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    listening.close()  # once the server is gone, a client runs its tool itself
    os.close(lit_alive)
    return server


def client_command(directory: str, tool: str) -> list[str]:
    """The command that runs `tool` in a child of the server started on `directory`."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), os.path.join(directory, "socket"), tool]


# --------------------------------------------------------------------------- #
# The client: a RUN line's command                                             #
# --------------------------------------------------------------------------- #


def request(path: str, tool: str, args: list[str]) -> int:
    """Runs `TOOL ARGS` in a child of the server at `path`; returns its exit status."""
    connection = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        os.execv(sys.executable, [sys.executable, *COMMANDS[tool], *args])
    payload = marshal.dumps((tool, args, os.getcwd(), dict(os.environ)))
    descriptors = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # C ints, as socket.send_fds
    connection.sendmsg(
        [len(payload).to_bytes(_HEADER, "little")], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, descriptors)]
    )
    connection.sendall(payload)
    status = _receive_exactly(connection, 4)
    if len(status) < 4:
        sys.stderr.write(f"{tool}: the preloaded process ended without an exit status\n")
        return 70
    return int.from_bytes(status, "little", signed=True)


def _receive_exactly(connection: _socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


# --------------------------------------------------------------------------- #
# The server                                                                   #
# --------------------------------------------------------------------------- #


def serve(listening: _socket.socket, lit_alive: int) -> None:
    """Imports the tools, then forks a child per connection, until lit exits (`lit_alive`, the
    read end of lit's pipe, is then at its end) or the server is terminated."""
    import selectors
    import signal

    import filecheck.__main__
    from filecheck.main import main as filecheck_main

    sys.path.insert(0, os.path.dirname(HIR_OPT))
    from checkout import import_hostir_from_checkout  # as tools/hir-opt.py does

    import_hostir_from_checkout()
    from hostir.passes import HOSTIR_PASSES
    from hostir.tools.hir_opt import main as hir_opt_main

    for load_pass in HOSTIR_PASSES.values():  # the modules of hostir's passes, which RUN lines name
        load_pass()
    # What a first run does once (the contexts' dialects, the parser's and printer's caches)
    # is then done for every child: it halves the time of a child that only parses and prints.
    hir_opt_main([WARM_UP, "-p", "hir-lowering", "-o", os.devnull])

    # Each tool's main, and its sys.argv[0] as its script would see it.
    tools = {"hir-opt": (hir_opt_main, HIR_OPT), "filecheck": (filecheck_main, filecheck.__main__.__file__)}
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    selector = selectors.DefaultSelector()
    selector.register(listening, selectors.EVENT_READ)
    selector.register(lit_alive, selectors.EVENT_READ)  # readable only at its end: lit is gone
    while not terminated:
        ready = [key.fileobj for key, _ in selector.select(timeout=0.2)]
        if lit_alive in ready:
            break
        if not ready:
            continue
        connection, _ = listening.accept()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            selector.close()
            listening.close()
            os.close(lit_alive)
            os._exit(_run_child(connection, tools))
        connection.close()
    path = listening.getsockname()
    os.unlink(path)
    os.rmdir(os.path.dirname(path))


def _run_child(connection: _socket.socket, tools: dict) -> int:
    """In the forked child: becomes the client's command and sends back its exit status."""
    import socket

    header, fds, _, _ = socket.recv_fds(connection, _HEADER, 3)
    tool, args, cwd, environment = marshal.loads(
        _receive_exactly(connection, int.from_bytes(header, "little"))
    )
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    main, script = tools[tool]
    sys.argv = [script, *args]
    _reopen_standard_streams()
    status = _exit_status(main)
    connection.sendall(status.to_bytes(4, "little", signed=True))
    return 0


def _reopen_standard_streams() -> None:
    """sys.stdin, stdout and stderr on the new descriptors 0-2, buffered as at Python's start."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    streams = []
    for fd, (mode, started) in enumerate((("rb", sys.stdin), ("wb", sys.stdout), ("wb", sys.stderr))):
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = (io.BufferedReader if mode == "rb" else io.BufferedWriter)(raw)
        streams.append(
            io.TextIOWrapper(
                buffered,
                encoding=started.encoding,
                errors=started.errors,
                line_buffering=fd == 2 or (fd == 1 and raw.isatty()),
                write_through=unbuffered and fd != 0,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _exit_status(main) -> int:
    """Runs `sys.exit(main())` as the interpreter runs a script: the status it exits with."""
    import traceback

    try:
        status = main()
    except SystemExit as done:
        status = done.code
    except BaseException:
        traceback.print_exc()
        status = 1
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            status = status or 120  # as the interpreter, whose final flush fails
    return status


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        import socket

        serve(socket.socket(fileno=int(sys.argv[2])), int(sys.argv[3]))
    else:
        sys.exit(request(sys.argv[1], sys.argv[2], sys.argv[3:]))
