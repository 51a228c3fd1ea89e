"""Whole gradings: Gradescope's tree, feedback, hostile and course-style submissions."""
