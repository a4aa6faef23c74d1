"""Policy protocols and their registry. Built-in policies live in the top-level `plugins/`
package and are found, like third-party ones, only through entry points."""
