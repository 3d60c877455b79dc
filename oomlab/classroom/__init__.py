"""The nbgrader course: the same exercises, graded in notebooks on a GPU, a whole class at once.

An instructor runs ``oomlab nbgrader build DIR`` once and then nbgrader's own
commands. Every notebook is derived from its exercise folder when it is built;
nothing is kept in step by hand.

- :mod:`~oomlab.classroom.layout`: where everything lives in such a course folder;
- :mod:`~oomlab.classroom.scoring`: which checks (an estimate exercise: which parts) earn points and which guard
  them, and the file a cell writes;
- :mod:`~oomlab.classroom.notebook`: one exercise as a source notebook (cells, points, hidden tests);
- :mod:`~oomlab.classroom.build`: the course folder itself: ``nbgrader_config.py``, the pinned
  copy of the exercises the grading measures against, one assignment per module;
- :mod:`~oomlab.classroom.cells`: what the notebook's locked cells call, in the notebook's
  kernel: the learner's cell measured in a fresh process, as ``oomlab check`` measures it
  (an estimator: answered in its sandbox, then its hidden configs measured);
- :mod:`~oomlab.classroom.preprocessors`: the nbgrader preprocessor that grades only the
  exercise cell's script, never code run in the grading kernel;
- :mod:`~oomlab.classroom.handin` and :mod:`~oomlab.classroom.kernel`: nothing handed in
  beside the notebooks stays where they are graded, and the grading kernel imports nothing
  from that folder, so no file of a student's can stand in for the grader;
- :mod:`~oomlab.classroom.classgrade`: a class's submissions measured in parallel on one GPU
  (its estimators graded one after another), then nbgrader's ``autograde``, then who failed
  which check or part and why; :mod:`~oomlab.classroom.measured` keeps each measurement and
  grade for the notebook's cells;
- :mod:`~oomlab.classroom.student`: the wheel to give students, without the reference fixes
  and model answers (written by :mod:`~oomlab.classroom.wheel`, its manifests by
  :mod:`~oomlab.classroom.tomltext`).
"""
