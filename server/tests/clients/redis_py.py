#!/usr/bin/env python3
"""redis-py against `turnstile serve`, as an application would use it.

    redis_py.py PORT PROTOCOL [PASSWORD]

PROTOCOL is 2 or 3 (RESP2, or RESP3 after HELLO 3). Prints one JSON object: what each call
returned, or the error it raised, by name. Exit status 2 when redis-py is missing.
"""

import json
import sys

try:
    import redis
except ImportError as e:
    sys.stderr.write(
        f"redis_py.py: redis-py is missing ({e}) in {sys.executable}: run `cargo xtask test`, "
        "which installs it into target/test-deps/venv and sets TURNSTILE_TEST_PYTHON\n"
    )
    sys.exit(2)


def attempt(f):
    try:
        return f()
    except redis.RedisError as e:
        return {"error": type(e).__name__, "message": str(e)}


def main():
    port, proto = int(sys.argv[1]), int(sys.argv[2])
    password = sys.argv[3] if len(sys.argv) > 3 else None
    r = redis.Redis(
        host="127.0.0.1",
        port=port,
        protocol=proto,
        password=password,
        decode_responses=True,
        socket_timeout=10,
    )
    out = {"version": redis.__version__, "ping": attempt(r.ping)}

    def transaction():
        # The default pipeline: MULTI ... EXEC.
        p = r.pipeline()
        p.execute_command("CL.THROTTLE", f"py{proto}", 5, 10, 60)
        p.execute_command("CL.THROTTLE", f"py{proto}", 5, 10, 60)
        p.ping()
        return p.execute()

    out["transaction"] = attempt(transaction)

    def plain():
        p = r.pipeline(transaction=False)
        p.execute_command("CL.THROTTLE", f"py{proto}", 5, 10, 60)
        p.echo("hi")
        return p.execute()

    out["pipeline"] = attempt(plain)

    def transaction_with_a_bad_command():
        p = r.pipeline()
        p.execute_command("CL.THROTTLE", f"bad{proto}", 5, 10, 60)
        p.execute_command("NO.SUCH.COMMAND", "x")
        return p.execute()

    out["transaction_bad"] = attempt(transaction_with_a_bad_command)
    # The command before the bad one was not run: the key is still fresh.
    out["after_bad"] = attempt(
        lambda: r.execute_command("CL.THROTTLE", f"bad{proto}", 5, 10, 60, 0)
    )

    def pipeline_with_a_bad_command():
        p = r.pipeline(transaction=False)
        p.execute_command("CL.THROTTLE", f"bad{proto}", 5, 10, 60)
        p.execute_command("CL.THROTTLE", f"bad{proto}", "x", 10, 60)
        p.ping()
        return [
            {"error": type(v).__name__, "message": str(v)} if isinstance(v, Exception) else v
            for v in p.execute(raise_on_error=False)
        ]

    out["pipeline_bad"] = attempt(pipeline_with_a_bad_command)
    out["client_info"] = attempt(r.client_info)
    out["client_setname"] = attempt(lambda: r.client_setname("app-1"))
    out["client_getname"] = attempt(r.client_getname)
    out["info_server"] = attempt(lambda: sorted(r.info("server").keys()))
    out["auth_default"] = attempt(lambda: r.execute_command("AUTH", "default", "x"))
    print(json.dumps(out, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
