"""The same API without async, for scripts and notebooks."""

from exec_server.blocking import Environment

with Environment.local() as env:
    print(env.run(["uname", "-s"]).stdout.decode(), end="")
    proc = env.start(["sh", "-c", "for i in 1 2 3; do echo $i; done"])
    for data in proc.stdout:
        print("got", data)
    print("exit", proc.wait())
