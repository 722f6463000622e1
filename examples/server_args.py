"""Command-line options of a small web server (an example file for trying Ditto)."""

import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Serve files over HTTP")
    parser.add_argument("--host", default="localhost", help="address to bind")
    parser.add_argument("--port", type=int, default=8080, help="port to bind")
    parser.add_argument("--workers", type=int, default=4, help="number of worker processes")
    parser.add_argument("--timeout", type=int, default=30, help="request timeout in seconds")
    parser.add_argument("--root", default=".", help="directory to serve")
    parser.add_argument("--
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    print(f"serving {args.root} on {args.host}:{args.port} with {args.workers} workers")


if __name__ == "__main__":
    main()
