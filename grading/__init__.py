"""The grader: students' notebooks graded by the book's own checkers (``make grade``,
``python -m grading``).  grading/README.md explains how it works; each module says what it
does in its first line:

cli              the command line (``python -m grading``)
grade            grading a class: tasks per student and exercise, handed to the judges
chapters         the chapters as the grader sees them (exercises, checker calls, solutions)
submissions      the students' notebooks: whose, and which chapter
reports          results.csv/.json, summary.md, nbgrader's and otter's CSVs
gradebook        the class: rosters, learning platforms' names, gradebook.csv, feedback files
lint             the flags for the instructor; fingerprints of answers
judge            the trusted process that runs the checkers and decides each status
zygote           the judge's side of a chapter's sandboxed process and a student's process
worker           the sandbox side (never decides a grade): the chapter's cells, the student's
rpc              the wire between judge and sandbox (plain data and handles, never a pickle)
sandbox          the confinement: what the platform allows, bubblewrap's command line,
                 namespaces, capabilities and limits inside, cgroups
made_up_class    a made-up class of students (every profile, cheats and attacks)
instructor_files the generated parts of the instructor guide
gradescope       the grader as a Gradescope autograder (its files; results.json per submission)

The checkers are flashlib's (flashlib.book.exercises); the grader reaches them through one
module, flashlib.book.exercises.grader_adapter.  flashlib never imports grading, and grading
imports from tools only the book's readers (tools.convert, toc, colab, notebooks, paths).
This package's files import nothing at import time but the standard library (the sandbox's
worker loads only grading/__init__.py, worker.py, rpc.py and sandbox.py).
"""
