"""test_quiet_build.py — cli.quiet_build: deploy/build.sh, the build behind
`make build|run|demo|install`, says that it configures and how far it has
compiled, then prints a short summary (with the backends this machine can
use) and the binaries' absolute paths instead of CMake's and make's output,
and on a failure the compiler's error and where the whole log is.

It builds a two-file CMake project in a temporary directory (seconds), from
inside a make (MAKEFLAGS=-w, the flag that printed every "Entering
directory" line), once as it is and once with a syntax error.
"""
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("TY_SRC", "")


def fail(msg):
    print("FAIL cli.quiet_build: " + msg, file=sys.stderr)
    sys.exit(1)


def build(proj):
    env = dict(os.environ, MAKEFLAGS="-w", MAKELEVEL="1")
    return subprocess.run(["bash", os.path.join(SRC, "deploy", "build.sh"), "b", "Release", "2", "trainyard"],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=300)


def main():
    if not os.path.isfile(os.path.join(SRC, "deploy", "build.sh")):
        fail("TY_SRC must name the source tree")
    with tempfile.TemporaryDirectory(prefix="ty-quiet-") as proj:
        with open(os.path.join(proj, "CMakeLists.txt"), "w") as f:
            f.write("cmake_minimum_required(VERSION 3.25)\nproject(trainyard VERSION 9.8.7 LANGUAGES C)\n"
                    "message(STATUS \"trainyard: CUDA backend OFF, sanitizers OFF\")\n"
                    "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
                    "add_executable(trainyard main.c)\n")
        main_c = os.path.join(proj, "main.c")
        with open(main_c, "w") as f:
            f.write("int main(void) { return 0; }\n")
        r = build(proj)
        if r.returncode != 0:
            fail("the build failed: %s %s" % (r.stdout, r.stderr))
        out = r.stdout + r.stderr
        lines = out.splitlines()
        real = os.path.realpath(proj)
        # configuring (a first build), progress lines, then the summary,
        # the backends and the path
        if not lines or not lines[0].startswith("build: configuring Release in b (first build"):
            fail("the first line says it configures a first build; got:\n" + out)
        progress = [l for l in lines[1:-3] if l.startswith("build: compiling, ")]
        if len(progress) != len(lines) - 4 or any("%" not in l for l in progress):
            fail("between them only progress lines; got:\n" + out)
        want = ["build: trainyard 9.8.7 (Release) in",
                "build: backends usable here: CPU (CUDA not compiled",
                "  %s/b/bin/trainyard" % real]
        if not lines[-3].startswith(want[0]) or not lines[-2].startswith(want[1]) or lines[-1] != want[2]:
            fail("want the summary, the backends and the path last; got:\n" + out)
        if "b/build.log" not in lines[-3] or not os.path.isfile(os.path.join(proj, "b", "build.log")):
            fail("the summary names the log, which holds CMake's output:\n" + out)
        with open(os.path.join(proj, "b", "build.log")) as f:
            if "Built target trainyard" not in f.read():
                fail("build.log lacks the build's own output")

        with open(main_c, "w") as f:
            f.write("int main(void) { return undeclared_thing; }\n")
        r = build(proj)
        if r.returncode == 0:
            fail("a broken build exited 0")
        if "undeclared_thing" not in r.stderr or "b/build.log" not in r.stderr or "FAILED" not in r.stderr:
            fail("a failure shows the compiler's error and the log's path:\n" + r.stderr)
        if "Entering directory" in r.stdout + r.stderr.split("the end of the log")[0]:
            fail("make's directory lines leak into the error summary:\n" + r.stderr)
    print("ok cli.quiet_build")


if __name__ == "__main__":
    main()
