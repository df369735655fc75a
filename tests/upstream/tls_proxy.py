"""A TLS front for an upstream MCP server over plain HTTP, for the https
test of code calls tools (tests/suite/code_tools.rs): terminates TLS with
CERT/KEY on 127.0.0.1 (a free port, written to PORT_FILE once listening) and
relays each connection to 127.0.0.1:UPSTREAM_PORT. Standard library only.

    python3 tls_proxy.py CERT KEY UPSTREAM_PORT PORT_FILE
"""
import socket, ssl, sys, threading
cert, key, up_port, port_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(64)
open(port_file + ".tmp", "w").write("%d\n" % ls.getsockname()[1])
import os; os.rename(port_file + ".tmp", port_file)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
def serve(conn):
    try:
        tls = ctx.wrap_socket(conn, server_side=True)
    except (ssl.SSLError, OSError):
        conn.close(); return
    up = socket.create_connection(("127.0.0.1", up_port))
    threading.Thread(target=pipe, args=(tls, up), daemon=True).start()
    pipe(up, tls)
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
