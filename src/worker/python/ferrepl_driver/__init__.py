"""ferrepl's worker driver: runs inside each session's own interpreter.

Standard library only; CPython 3.9+. Optional libraries (matplotlib,
IPython, pandas, PIL) are only used when the session imports them.

Modules (each imports what it uses from the others explicitly):

    main        start-up, routing requests, the loop that runs cells
    control     the readers of requests: the main thread's (fd 3, between
                cells) and the control thread (fd 4), stoppable losslessly
    channel     the sockets (fds 3 and 4), events, fence markers on fds 1 and 2
    cells       running a cell: parse, run, value, errors, interrupts; the
                session's namespace
    stdin       sys.stdin, input() and getpass() answered by the agent
    display     values and rich display: repr, MIME bundles, images,
                matplotlib and IPython hooks
    introspect  requests answered on the control thread: inspect, complete,
                namespace edits, import refresh
    checkpoint  frozen copies of the state by fork(), resumed in place of the
                live interpreter; the anchor process that stays behind
    tools       the `ferrepl` module sessions import: code calls the
                operator's upstream MCP servers through the server
    signatures  an upstream tool's Python signature and help text, made
                from its input schema (for `ferrepl.tool()`)
    state       the session's variables saved (pickled, sent to the server)
                and loaded into a fresh interpreter
    _vendor     third-party code shipped unchanged with its licence
                (cloudpickle), compiled on first use

How it is loaded: the package is embedded in the ferrepl binary
(include_str! in src/worker/start.rs; a new module must be listed there) and
never read from disk: the sandbox hides the server's install location from
sessions. The server starts `python -c BOOTSTRAP`, which reads one
length-prefixed text from fd 3: ../boot.py, then each module's path and
source, separated by NUL. boot.py puts a meta-path finder over those sources
first on sys.meta_path, imports every module, takes the finder off again and
calls main.main(). What the session sees: `ferrepl_driver.*` in sys.modules,
no name in its namespace (`__main__`), sys.meta_path as without the finder.
Driver code has file names `<ferrepl-driver:PATH>`, whose frames tracebacks
leave out. The protocol is in docs/protocol.md.
"""
