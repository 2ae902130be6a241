"""What several test modules share: constants, functions and stand-ins, one module per
concern. A test module imports them from here, never from another test module
(tests/test_layout.py); tests/conftest.py has pytest rewrite their asserts as a test module's."""
