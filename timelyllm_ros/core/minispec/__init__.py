"""MiniSpec, one family in layers; each module imports only the ones before it (and, below the
family, `core/robots.py`, `core/envelope.py`, `core/types.py`):

    syntax.py   lexer, AST, THE parser and the literal schema checks
    travel.py   the flight envelope over the AST (worst-path travel of a segment / plan)
    check.py    static analysis over the AST: value types, loop product, calls per statement, envelope
    parse.py    `parse_statement` / `parse_program`: syntax, then (check=True) the static analysis
    run.py      the interpreter used by executors and the simulator; run-time argument checks

`core.minispec` is the one import for MiniSpec: the names below are the family's public ones.
"""

from .check import max_loop_product, statement_calls
from .parse import parse_program, parse_statement
from .run import run_program, run_statement
from .syntax import (ARITH_OPS, BOOL_OPS, CMP_OPS, COND_CHAIN, MAX_CALLS, MAX_DEPTH, MAX_EXPR_DEPTH, MAX_LOOP,
                     MAX_LOOP_PRODUCT, MAX_OPERATORS, MAX_STEPS, MAX_TEXT, RETURN_VALUE, RETURNED, ArgumentError, Assign,
                     BinOp, Call, CallStmt, Cond, Else, Expr, Lit, Loop, MiniSpecError, MiniSpecRuntimeError, Neg,
                     Parsed, Return, SetVar, Stmt, Var, arg_problem, check_call_args, string_problem, text_problem)

__all__ = [
    "ARITH_OPS", "BOOL_OPS", "CMP_OPS", "COND_CHAIN", "MAX_CALLS", "MAX_DEPTH", "MAX_EXPR_DEPTH", "MAX_LOOP",
    "MAX_LOOP_PRODUCT", "MAX_OPERATORS", "MAX_STEPS", "MAX_TEXT", "RETURNED", "RETURN_VALUE", "ArgumentError", "Assign",
    "BinOp", "Call", "CallStmt", "Cond", "Else", "Expr", "Lit", "Loop", "MiniSpecError", "MiniSpecRuntimeError", "Neg",
    "Parsed", "Return", "SetVar", "Stmt", "Var", "arg_problem", "check_call_args", "max_loop_product", "parse_program",
    "parse_statement", "run_program", "run_statement", "statement_calls", "string_problem", "text_problem",
]
