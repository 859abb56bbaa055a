"""What every command of the CLI shares: options, output, help formatting, --sglang-url."""
