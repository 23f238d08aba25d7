#!/usr/bin/env python3
"""Checks that the packaged config lists every knob of contracts/daemon_config.h.

Each field of a `struct <Name>Section` in config.h is a key of the TOML table
[<name>] (DaemonSection -> [daemon]); deploy/trainsupd.toml must mention it
in that table, set (`key = ...`) or commented with its default
(`# key = ...`). A field whose type is a vector of tables (auth.tokens) must
appear as `[[<table>.<key>]]`, with every field of its struct inside.
Usage: check_config_knobs.py CONFIG_H TRAINSUPD_TOML
"""
import re
import sys


def struct_fields(header: str, struct: str):
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, header, re.S)
    if body is None:
        sys.exit("check_config_knobs: struct %s not found" % struct)
    fields = []
    for line in body.group(1).splitlines():
        line = line.split("//")[0].strip()
        m = re.match(r"^([\w:<>, ]+?)\s+(\w+)\s*(=.*)?;$", line)
        if m:
            fields.append((m.group(1), m.group(2)))
    return fields


def table_texts(toml: str):
    """Text of each table, keyed by name, headers commented or not."""
    tables = {}
    current = None
    for line in toml.splitlines():
        m = re.match(r"^#?\s*\[\[?([\w.]+)\]\]?\s*$", line)
        if m:
            current = m.group(1)
            tables.setdefault(current, "")
            continue
        if current is not None:
            tables[current] += line + "\n"
    return tables


def main():
    header = open(sys.argv[1]).read()
    toml = open(sys.argv[2]).read()
    tables = table_texts(toml)
    missing = []
    for struct in re.findall(r"struct (\w+)Section \{", header):
        table = struct.lower()
        if table not in tables:
            missing.append("[%s]" % table)
            continue
        for type_, key in struct_fields(header, struct + "Section"):
            vector_of = re.match(r"std::vector<(\w+)>", type_)
            if vector_of and vector_of.group(1) != "std":
                sub = "%s.%s" % (table, key)
                if sub not in tables:
                    missing.append("[[%s]]" % sub)
                    continue
                for _, sub_key in struct_fields(header, vector_of.group(1)):
                    if not re.search(r"^#?\s*%s\s*=" % sub_key, tables[sub], re.M):
                        missing.append("%s.%s" % (sub, sub_key))
                continue
            if not re.search(r"^#?\s*%s\s*=" % key, tables[table], re.M):
                missing.append("%s.%s" % (table, key))
    if missing:
        print("deploy/trainsupd.toml does not list: " + ", ".join(missing))
        return 1
    print("every knob of config.h is listed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
